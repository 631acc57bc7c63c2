#!/usr/bin/env bash
# An SQS server from PyPI for the SQS tests (tests/brokers, targets `sqs`
# and `sqs_fifo`): moto's server (`moto[server]`), which keeps queues,
# visibility timeouts, receive counts, redrive policies and FIFO groups in
# memory (it loses everything when it stops). moto is not SQS: no speed
# of it stands for AWS's.
#
#   scripts/sqs.sh start   start it on 127.0.0.1:5000 (installs moto)
#   scripts/sqs.sh stop    stop it (only if this script started it)
#   scripts/sqs.sh url     the endpoint for INBOX_TEST_SQS_URL
#
# SQS_PORT=5001 scripts/sqs.sh start|stop|url: a second server, with
# queues of its own (.ci/run gives each SQS test process one: moto is a
# single Python process, and two processes' scenarios on one starved it).
# Run as root, the server gets a higher priority than the compiles beside
# it (nice -5): a reply that comes late under load looks like a lost
# heartbeat to the runner.
#
# moto goes into a virtual environment under ~/.cache/diesel-inbox (kept
# between runs); the server's log into target/sqs/ (target/sqs-<port>/
# for a port other than 5000; SQS_DIR moves them).
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
port="${SQS_PORT:-5000}"
case "$port" in
  5000) dir="${SQS_DIR:-$here/target/sqs}" ;;
  # Each server's pid file of its own, whatever SQS_DIR says.
  *) dir="${SQS_DIR:-$here/target/sqs}-$port" ;;
esac
venv="${SQS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/diesel-inbox/moto-venv}"

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

server_bin() {
  if [ ! -x "$venv/bin/moto_server" ]; then
    python3 -m venv "$venv" >/dev/null || {
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null && python3 -m venv "$venv"
    }
    "$venv/bin/pip" install -q 'moto[server]' >/dev/null
  fi
  echo "$venv/bin/moto_server"
}

start() {
  if port_open "$port"; then
    echo "a server already listens on 127.0.0.1:$port"
    return
  fi
  mkdir -p "$dir"
  local bin
  bin="$(server_bin)"
  local priority=()
  if [ "$(id -u)" = 0 ]; then priority=(nice -n -5); fi
  nohup "${priority[@]}" "$bin" -H 127.0.0.1 -p "$port" >"$dir/server.log" 2>&1 &
  echo $! >"$dir/server.pid"
  for _ in $(seq 1 150); do
    port_open "$port" && { echo "moto's SQS server on 127.0.0.1:$port"; return; }
    sleep 0.1
  done
  echo "moto's server did not start; its log:" >&2
  cat "$dir/server.log" >&2
  exit 1
}

stop() {
  if [ -f "$dir/server.pid" ]; then
    kill "$(cat "$dir/server.pid")" 2>/dev/null || true
    rm -f "$dir/server.pid"
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  url) echo "http://127.0.0.1:$port" ;;
  *) echo "usage: $0 start|stop|url" >&2; exit 2 ;;
esac
