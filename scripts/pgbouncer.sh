#!/usr/bin/env bash
# PgBouncer in transaction mode in front of the local PostgreSQL, for the
# proxy tests (tests/pgbouncer.rs).
#
#   scripts/pgbouncer.sh start   start it on 127.0.0.1:6432 (Debian's pgbouncer)
#   scripts/pgbouncer.sh stop    stop it
#   scripts/pgbouncer.sh url     the test URL through it
#
# Every database name maps to the same name on 127.0.0.1:5432 (the fresh
# databases of the tests too). Two server connections per database and
# user: the clients of a test share them, so that one client's
# transactions run on several server sessions and one session serves
# several clients, as in production with more clients than the pool. Its
# files live under target/pgbouncer/; it runs as `postgres` when started by
# root (PgBouncer refuses to run as root).
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
dir="${PGBOUNCER_DIR:-$here/target/pgbouncer}"
port=6432
role=diesel_inbox
password=diesel_inbox
db=diesel_inbox_test

start() {
  command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || {
    apt-get update -qq && apt-get install -y -qq pgbouncer >/dev/null
  }
  # Debian's package starts its own instance on 6432: ours replaces it.
  # and so does one that an earlier checkout started.
  if command -v service >/dev/null; then service pgbouncer stop >/dev/null 2>&1 || true; fi
  stop
  pkill -x pgbouncer 2>/dev/null || true
  for _ in $(seq 1 50); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || break
    sleep 0.1
  done
  mkdir -p "$dir"
  cat >"$dir/pgbouncer.ini" <<INI
[databases]
* = host=127.0.0.1 port=5432

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
pool_mode = transaction
default_pool_size = 2
max_client_conn = 500
auth_type = scram-sha-256
auth_file = $dir/userlist.txt
pidfile = $dir/pgbouncer.pid
logfile = $dir/pgbouncer.log
ignore_startup_parameters = extra_float_digits
server_reset_query =
log_connections = 0
log_disconnections = 0
INI
  printf '"%s" "%s"\n' "$role" "$password" >"$dir/userlist.txt"
  local user=()
  if [ "$(id -u)" = 0 ]; then
    chown -R postgres:postgres "$dir"
    user=(-u postgres)
  fi
  /usr/sbin/pgbouncer -d "${user[@]}" "$dir/pgbouncer.ini"
  for _ in $(seq 1 50); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
  done
  PGPASSWORD="$password" psql -q -h 127.0.0.1 -p "$port" -U "$role" -d "$db" -c "SELECT 1" >/dev/null \
    || { echo "cannot log in to PostgreSQL through PgBouncer on $port"; tail -20 "$dir/pgbouncer.log" || true; exit 1; }
  echo "pgbouncer $(/usr/sbin/pgbouncer --version | head -n1 | awk '{print $NF}') on 127.0.0.1:$port, transaction mode, pool size 2"
  echo
}

stop() {
  local pid
  pid=$(cat "$dir/pgbouncer.pid" 2>/dev/null) || return 0
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  rm -f "$dir/pgbouncer.pid"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  url) echo "postgres://$role:$password@127.0.0.1:$port/$db" ;;
  *) echo "usage: $0 start|stop|url" >&2; exit 2 ;;
esac
