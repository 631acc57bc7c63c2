#!/usr/bin/env bash
# A PostgreSQL primary and its streaming standby on loopback, for the
# failover tests: two clusters of Debian's PostgreSQL, apart from the
# machine's own server (its settings and its other users are not touched).
#
#   scripts/pg-failover.sh start async|sync [REPLICATION_PORT]
#       a fresh primary on 127.0.0.1:15432 and a standby on 127.0.0.1:15433
#       (pg_basebackup), streaming; `sync` sets synchronous_standby_names
#       on the primary (synchronous_commit = on: a commit waits for the
#       standby's flush). The standby reaches the primary on
#       REPLICATION_PORT (default 15432): a test puts a proxy there to
#       delay or cut replication. Waits until the standby streams.
#   scripts/pg-failover.sh kill       SIGKILL the primary (every process of it)
#   scripts/pg-failover.sh promote    promote the standby (pg_ctl promote)
#   scripts/pg-failover.sh stop       stop both and remove their directories
#   scripts/pg-failover.sh status     each server's role and replication state
#   scripts/pg-failover.sh urls       the primary's and the standby's test URLs
#
# Both clusters run as `postgres` when called by root, with trust
# authentication on loopback only. The test role `diesel_inbox` /
# `diesel_inbox` (CREATEDB) owns the database `diesel_inbox_test`, as on
# the single server.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
root="${PG_FAILOVER_DIR:-$here/target/pg-failover}"
bin="/usr/lib/postgresql/$(ls /usr/lib/postgresql 2>/dev/null | sort -V | tail -n1)/bin"
primary_port=15432
standby_port=15433
role=diesel_inbox
password=diesel_inbox
db=diesel_inbox_test

# A command as the server's user (root may not run PostgreSQL).
as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
psql_at() {
  local port=$1; shift
  as_pg "$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -Atq "$@"
}
# The postmaster's pid of the cluster in directory $1, if it runs: the
# pid file's, when that process is a postgres of this directory (a killed
# server leaves its pid file, whose pid may since be another process's).
postmaster() {
  [ -f "$1/postmaster.pid" ] || return 0
  local p
  p="$(head -n1 "$1/postmaster.pid")"
  [ -n "$p" ] && tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q -- "postgres -D $1" && echo "$p"
  return 0
}

stop_all() {
  for d in "$root/primary" "$root/standby"; do
    local p
    p="$(postmaster "$d")"
    if [ -n "$p" ]; then
      kill -9 $(ps -o pid= --ppid "$p" || true) "$p" 2>/dev/null || true
      for _ in $(seq 1 40); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    fi
  done
  rm -rf "$root"
}

start() {
  local mode="${1:?start async|sync [REPLICATION_PORT]}" via="${2:-$primary_port}"
  case "$mode" in async | sync) ;; *) echo "start: async or sync, not $mode" >&2; exit 2 ;; esac
  [ -x "$bin/initdb" ] || { echo "no PostgreSQL server binaries under $bin (package postgresql)" >&2; exit 1; }
  stop_all
  mkdir -p "$root"
  [ "$(id -u)" = 0 ] && chown postgres: "$root"
  as_pg "$bin/initdb" -D "$root/primary" -U postgres --auth=trust -E UTF8 --locale=C --no-sync >/dev/null
  cat >>"$root/primary/postgresql.conf" <<EOF
port = $primary_port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$root'
wal_level = replica
max_wal_senders = 4
wal_keep_size = '256MB'
max_connections = 60
shared_buffers = '32MB'
EOF
  as_pg "$bin/pg_ctl" -D "$root/primary" -l "$root/primary.log" -w -t 60 start >/dev/null
  # pg_read_all_stats: as a monitoring role has it, so that doctor and the
  # catalog read which standby is synchronous.
  psql_at "$primary_port" -c "CREATE ROLE $role LOGIN PASSWORD '$password' CREATEDB" \
    -c "GRANT pg_read_all_stats TO $role" -c "CREATE DATABASE $db OWNER $role"
  as_pg "$bin/pg_basebackup" -h 127.0.0.1 -p "$primary_port" -U postgres -D "$root/standby" -R -X stream -c fast
  cat >>"$root/standby/postgresql.conf" <<EOF
port = $standby_port
EOF
  # After -R's line: the standby's name (which synchronous_standby_names
  # lists) and the port it reaches the primary on.
  echo "primary_conninfo = 'host=127.0.0.1 port=$via user=postgres application_name=standby'" \
    | as_pg tee -a "$root/standby/postgresql.auto.conf" >/dev/null
  as_pg "$bin/pg_ctl" -D "$root/standby" -l "$root/standby.log" -w -t 60 start >/dev/null
  if [ "$mode" = sync ]; then
    psql_at "$primary_port" -c "ALTER SYSTEM SET synchronous_standby_names = 'standby'" \
      -c "ALTER SYSTEM SET synchronous_commit = 'on'" -c "SELECT pg_reload_conf()" >/dev/null
  fi
  local want=async
  [ "$mode" = sync ] && want=sync
  for _ in $(seq 1 600); do
    [ "$(psql_at "$primary_port" -c "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby' AND state = 'streaming'")" = "$want" ] && { status; return 0; }
    sleep 0.1
  done
  echo "the standby did not stream ($want) within 60 s; the end of its log:" >&2
  tail -n 20 "$root/standby.log" >&2
  exit 1
}

status() {
  for side in primary standby; do
    local port=$primary_port
    [ "$side" = standby ] && port=$standby_port
    if [ -n "$(postmaster "$root/$side")" ]; then
      echo "$side: port $port, in recovery: $(psql_at "$port" -c 'SELECT pg_is_in_recovery()'), standbys: $(psql_at "$port" -c "SELECT coalesce(string_agg(application_name || ' ' || state || ' ' || sync_state, ', '), 'none') FROM pg_stat_replication")"
    else
      echo "$side: port $port, not running"
    fi
  done
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop) stop_all ;;
  status) status ;;
  urls)
    echo "postgres://$role:$password@127.0.0.1:$primary_port/$db,postgres://$role:$password@127.0.0.1:$standby_port/$db"
    ;;
  kill)
    p="$(postmaster "$root/primary")"
    [ -n "$p" ] || { echo "the primary is not running" >&2; exit 1; }
    # Every process of the server at once, as a crash of its machine: no
    # backend finishes a commit after the postmaster is gone.
    # (a child may have exited by itself meanwhile: that kill's error is
    # not this one's)
    kill -9 $(ps -o pid= --ppid "$p" || true) "$p" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$p" 2>/dev/null; then echo "the primary ($p) survived SIGKILL" >&2; exit 1; fi
    ;;
  promote)
    as_pg "$bin/pg_ctl" -D "$root/standby" -w -t 60 promote >/dev/null
    for _ in $(seq 1 300); do
      [ "$(psql_at "$standby_port" -c 'SELECT pg_is_in_recovery()')" = f ] && exit 0
      sleep 0.1
    done
    echo "the standby was still in recovery 30 s after pg_ctl promote" >&2
    exit 1
    ;;
  *)
    echo "usage: $0 start async|sync [REPLICATION_PORT] | kill | promote | stop | status | urls" >&2
    exit 2
    ;;
esac
