#!/usr/bin/env bash
# A 3-node MariaDB Galera cluster on loopback, for the cluster tests.
#
#   scripts/galera-cluster.sh start      bootstrap node 1, join nodes 2 and 3 (SST)
#   scripts/galera-cluster.sh stop       stop every node
#   scripts/galera-cluster.sh status     each node's state and the cluster size
#   scripts/galera-cluster.sh rejoin N   start node N again (after a kill); it
#                                        rejoins by IST or SST and waits for Synced
#   scripts/galera-cluster.sh kill N     SIGKILL node N
#   scripts/galera-cluster.sh urls       the three test URLs, comma-separated
#
# Each node has its own data directory under target/galera/ and its own
# ports: SQL on 13306 + N, Galera replication on 14567 + 10 N, IST on that
# port + 1, SST on that port + 2 (never 3306, so the machine's own MariaDB
# keeps running). Nodes run as the calling user (as `mysql` when that is
# root), fully detached (setsid -f, every fd redirected), so that `$(...)` around
# this script returns. The test role `diesel_inbox` / `diesel_inbox` gets
# the database `diesel_inbox_test`, as on the single server.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
root="${GALERA_DIR:-$here/target/galera}"
provider=/usr/lib/galera/libgalera_smm.so
nodes=(1 2 3)
role=diesel_inbox
password=diesel_inbox
db=diesel_inbox_test

sql_port() { echo $((13306 + $1)); }
repl_port() { echo $((14567 + 10 * $1)); }
dir() { echo "$root/node$1"; }
socket() { echo "$(dir "$1")/mysqld.sock"; }
client() { local n=$1; shift; mariadb --no-defaults -uroot --socket="$(socket "$n")" "$@"; }

# As root, the nodes run as `mysql` (as Debian's own server does): the
# rsync daemon that receives an SST drops root for `nobody` otherwise and
# cannot write the data directory. As anyone else, as that user.
user_line() {
  if [ "$(id -u)" = 0 ] && id mysql >/dev/null 2>&1; then echo "user=mysql"; fi
}

own() {
  if [ "$(id -u)" = 0 ] && id mysql >/dev/null 2>&1; then chown -R mysql:mysql "$root"; fi
}

cluster_address() {
  local list=()
  for n in "${nodes[@]}"; do list+=("127.0.0.1:$(repl_port "$n")"); done
  (IFS=,; echo "gcomm://${list[*]}")
}

write_config() {
  local n=$1 d p
  d="$(dir "$n")"
  p="$(repl_port "$n")"
  mkdir -p "$d/data"
  cat >"$d/my.cnf" <<EOF
[mysqld]
datadir=$d/data
socket=$d/mysqld.sock
pid-file=$d/mysqld.pid
log-error=$d/error.log
port=$(sql_port "$n")
bind-address=127.0.0.1
$(user_line)
skip-name-resolve
# As Debian's own server is configured.
character-set-server=utf8mb4
collation-server=utf8mb4_general_ci
innodb_buffer_pool_size=64M
innodb_log_file_size=32M
innodb_flush_log_at_trx_commit=2
# Synchronous I/O threads, not io_uring: a SIGKILLed node with io_uring
# requests in flight was seen holding its listening ports for over ten
# minutes while the kernel finished its exit, so it could not rejoin.
innodb_use_native_aio=0
binlog_format=ROW
default_storage_engine=InnoDB
innodb_autoinc_lock_mode=2
wsrep_on=ON
wsrep_provider=$provider
wsrep_cluster_name=diesel_inbox_galera
wsrep_cluster_address=$(cluster_address)
wsrep_node_name=node$n
wsrep_node_address=127.0.0.1
wsrep_provider_options="base_port=$p;gmcast.listen_addr=tcp://127.0.0.1:$p;ist.recv_addr=127.0.0.1:$((p + 1));gcache.size=64M"
wsrep_sst_receive_address=127.0.0.1:$((p + 2))
wsrep_sst_method=rsync
# Reads wait for every write the cluster committed before them (causal
# reads): a test checks on one node what a handler committed on another.
wsrep_sync_wait=1
EOF
}

# The node's server process (it writes its pid file only once started).
pid() { { pgrep -f -- "--defaults-file=$(dir "$1")/my.cnf" || true; } | head -n1; }
running() { [ -n "$(pid "$1")" ]; }
# Whether anything listens on node N's SQL, Galera, IST or SST port (a
# leftover rsync daemon of an SST listens on the last).
listening() {
  local p; p="$(repl_port "$1")"
  [ -n "$(ss -ltnH "( sport = :$(sql_port "$1") or sport = :$p or sport = :$((p + 1)) or sport = :$((p + 2)) )" 2>/dev/null)" ]
}

# Whether a socket other than a TIME-WAIT one holds node N's SQL, Galera or
# IST port (a killed node's connections close after the process is gone).
held() {
  local p; p="$(repl_port "$1")"
  [ -n "$(ss -tanH "( sport = :$(sql_port "$1") or sport = :$p or sport = :$((p + 1)) or sport = :$((p + 2)) )" 2>/dev/null | grep -v '^TIME-WAIT' || true)" ]
}

# Every process of node N: the server, and what it started (the SST script
# and its rsync daemon), whose command lines name the node's directory.
# Launched with setsid, they share the server's session too.
procs() {
  { pgrep -f -- "$(dir "$1")/" || true
    local p; p="$(pid "$1")"; [ -z "$p" ] || pgrep -s "$p" || true; } | sort -u
}

# What holds node N's ports in LISTEN, with each holder's state and command.
holders() {
  local p; p="$(repl_port "$1")"
  ss -ltnpH "( sport = :$(sql_port "$1") or sport = :$p or sport = :$((p + 1)) or sport = :$((p + 2)) )" 2>/dev/null || true
  for h in $(ss -ltnpH "( sport = :$(sql_port "$1") or sport = :$p or sport = :$((p + 1)) or sport = :$((p + 2)) )" 2>/dev/null \
      | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u); do
    ps -o pid=,stat=,wchan:32=,args= -p "$h" 2>/dev/null || true
  done
}

state() { client "$1" -N -e "SHOW STATUS LIKE 'wsrep_local_state_comment'" 2>/dev/null | cut -f2; }

wait_synced() {
  local n=$1
  for _ in $(seq 1 120); do
    [ "$(state "$n")" = "Synced" ] && return 0
    if ! running "$n"; then
      echo "node $n exited; the end of $(dir "$n")/error.log:" >&2
      tail -n 30 "$(dir "$n")/error.log" >&2
      return 1
    fi
    sleep 0.5
  done
  echo "node $n did not reach Synced in 60 s; the end of $(dir "$n")/error.log:" >&2
  tail -n 30 "$(dir "$n")/error.log" >&2
  return 1
}

launch() {
  local n=$1; shift
  setsid -f /usr/sbin/mariadbd --defaults-file="$(dir "$n")/my.cnf" "$@" </dev/null >/dev/null 2>&1
}

start() {
  [ -x "$provider" ] || [ -f "$provider" ] || { echo "no Galera provider at $provider (package galera-4)" >&2; exit 1; }
  command -v rsync >/dev/null || { echo "rsync is needed for SST" >&2; exit 1; }
  if running 1 && [ "$(state 1)" = "Synced" ]; then
    echo "already running"
    status
    return 0
  fi
  stop >/dev/null 2>&1 || true
  for n in "${nodes[@]}"; do
    for port in "$(sql_port "$n")" "$(repl_port "$n")"; do
      if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "port $port is in use (a cluster started from another checkout? stop it there)" >&2
        exit 1
      fi
    done
  done
  rm -rf "$root"
  for n in "${nodes[@]}"; do write_config "$n"; done
  own
  mariadb-install-db --defaults-file="$(dir 1)/my.cnf" --auth-root-authentication-method=socket \
    --skip-test-db >"$(dir 1)/install.log" 2>&1 \
    || { cat "$(dir 1)/install.log" >&2; exit 1; }
  launch 1 --wsrep-new-cluster
  wait_synced 1
  client 1 -e "CREATE USER IF NOT EXISTS '$role'@'%' IDENTIFIED BY '$password';
    GRANT ALL PRIVILEGES ON *.* TO '$role'@'%';
    CREATE DATABASE IF NOT EXISTS $db;"
  # The joiners need a data directory to receive the SST into.
  for n in 2 3; do
    launch "$n"
    wait_synced "$n"
  done
  status
}

stop() {
  for n in "${nodes[@]}"; do
    if running "$n"; then
      kill "$(pid "$n")" 2>/dev/null || true
    fi
  done
  for n in "${nodes[@]}"; do
    for _ in $(seq 1 60); do running "$n" || break; sleep 0.5; done
  done
  echo "stopped"
}

status() {
  for n in "${nodes[@]}"; do
    if running "$n"; then
      printf 'node %s: port %s, %s, cluster size %s\n' "$n" "$(sql_port "$n")" "$(state "$n")" \
        "$(client "$n" -N -e "SHOW STATUS LIKE 'wsrep_cluster_size'" 2>/dev/null | cut -f2)"
    else
      printf 'node %s: not running\n' "$n"
    fi
  done
}

urls() {
  local list=()
  for n in "${nodes[@]}"; do list+=("mysql://$role:$password@127.0.0.1:$(sql_port "$n")/$db"); done
  (IFS=,; echo "${list[*]}")
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  urls) urls ;;
  kill)
    n="${2:?kill N}"
    if running "$n"; then
      p="$(pid "$n")"
      # The server and every process it started.
      for q in $(procs "$n"); do kill -9 "$q" 2>/dev/null || true; done
      # pgrep stops matching once the process has dropped its memory, which
      # is before its sockets close: wait for the process itself (gone, or a
      # zombie, which holds no socket) and for its ports to be free.
      for _ in $(seq 1 80); do
        st="$(awk '/^State:/ {print $2}' "/proc/$p/status" 2>/dev/null || true)"
        { [ -z "$st" ] || [ "$st" = Z ]; } && ! listening "$n" && break
        sleep 0.25
      done
    fi
    ;;
  rejoin)
    n="${2:?rejoin N}"
    # A node whose Galera port is still held (a socket of the killed process
    # the kernel has not released yet) exits at once with "Address already in
    # use". Wait until no socket but a TIME-WAIT one holds its ports, then
    # start it; should it exit while joining, start it again, for up to about
    # two minutes, rather than fail the test on it.
    log="$(dir "$n")/error.log"
    for try in $(seq 1 12); do
      # Only this try's lines of the log count.
      from=$(($(stat -c %s "$log" 2>/dev/null || echo 0) + 1))
      if ! running "$n"; then
        for _ in $(seq 1 120); do held "$n" || break; sleep 0.5; done
        # A leftover of the killed node (a helper it started) that still
        # listens is killed too; what holds the ports is printed.
        if listening "$n"; then
          echo "node $n: its ports are still held before try $try:" >&2
          holders "$n" >&2
          for q in $(procs "$n"); do kill -9 "$q" 2>/dev/null || true; done
          for _ in $(seq 1 40); do listening "$n" || break; sleep 0.25; done
        fi
        launch "$n"
      fi
      if wait_synced "$n" 2>/tmp/galera-rejoin.$$; then rm -f /tmp/galera-rejoin.$$; exit 0; fi
      # A node that exited while joining is started again: seen causes are a
      # port still held ("Address already in use") and Galera's gcomm thread
      # failing at start ("Failed to read thread schedparams"). A node that
      # runs but does not reach Synced in 60 s fails the rejoin at once.
      if [ "$try" -lt 12 ] && ! running "$n" && grep "exited" /tmp/galera-rejoin.$$ >/dev/null; then
        echo "node $n exited while joining (try $try); starting it again in 2 s. Its log's errors:" >&2
        tail -c +"$from" "$log" 2>/dev/null | grep -E "ERROR|Address already in use" | tail -n 5 >&2 || true
        holders "$n" >&2
        for _ in $(seq 1 40); do running "$n" || break; sleep 0.25; done
        sleep 2
        continue
      fi
      cat /tmp/galera-rejoin.$$ >&2; rm -f /tmp/galera-rejoin.$$; exit 1
    done
    ;;
  *)
    echo "usage: $0 start|stop|status|urls|kill N|rejoin N" >&2
    exit 2
    ;;
esac
