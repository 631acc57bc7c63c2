#!/usr/bin/env bash
# A 3-node RabbitMQ cluster on loopback, for the node-loss scenarios, apart
# from the machine's own node (rabbit@localhost, port 5672).
#
#   scripts/rabbit-cluster.sh start      a fresh cluster: nodes inbox-testN@localhost,
#                                        AMQP on 5681-5683 (distribution on
#                                        25681-25683); waits until nodes 2 and 3
#                                        have joined node 1
#   scripts/rabbit-cluster.sh kill N     SIGKILL node N (1-3)
#   scripts/rabbit-cluster.sh restart N  start node N again (its data kept; it
#                                        rejoins the cluster)
#   scripts/rabbit-cluster.sh stop       stop every node and remove the data
#   scripts/rabbit-cluster.sh url N      node N's AMQP URL (guest, vhost /)
#   scripts/rabbit-cluster.sh urls       the three URLs, comma-separated
#
# Debian's RabbitMQ, its scripts under /usr/lib/rabbitmq/bin run directly
# with each node's own name, ports, data directory (target/rabbit-cluster/nN
# or $RABBIT_CLUSTER_DIR) and configuration; no plugins. As root the nodes
# run as `rabbitmq`, whose Erlang cookie the machine's own node uses too.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
root="${RABBIT_CLUSTER_DIR:-$here/target/rabbit-cluster}"
bin=/usr/lib/rabbitmq/bin
nodes=(1 2 3)

amqp_port() { echo $((5680 + $1)); }
name() { echo "inbox-test$1@localhost"; }
url() { echo "amqp://guest:guest@127.0.0.1:$(amqp_port "$1")/%2f"; }

# As root, as `rabbitmq` (its home holds the cookie); else as the caller.
as_broker() {
  if [ "$(id -u)" = 0 ] && id rabbitmq >/dev/null 2>&1; then
    runuser -u rabbitmq -- env HOME=/var/lib/rabbitmq "$@"
  else
    "$@"
  fi
}
ctl() { local n=$1; shift; as_broker "$bin/rabbitmqctl" -q -n "$(name "$n")" "$@"; }

# The node's Erlang VM (its environment names the node; its command line
# does not).
pid() {
  local p
  for p in $(pgrep -x beam.smp || true); do
    if grep -qz "^RABBITMQ_NODENAME=$(name "$1")\$" "/proc/$p/environ" 2>/dev/null; then echo "$p"; return; fi
  done
}

configure() {
  local n=$1 d="$root/n$1"
  mkdir -p "$d/log"
  cat >"$d/rabbitmq.conf" <<EOF
listeners.tcp.local = 127.0.0.1:$(amqp_port "$n")
loopback_users = none
EOF
  echo '[].' >"$d/enabled_plugins"
  # Instead of /etc/rabbitmq/rabbitmq-env.conf (the machine's node name).
  cat >"$d/rabbitmq-env.conf" <<EOF
ERL_EPMD_ADDRESS=127.0.0.1
EOF
}

launch() {
  local n=$1 d="$root/n$1"
  [ "$(id -u)" = 0 ] && id rabbitmq >/dev/null 2>&1 && chown -R rabbitmq:rabbitmq "$root"
  as_broker setsid -f env \
    RABBITMQ_CONF_ENV_FILE="$d/rabbitmq-env.conf" \
    RABBITMQ_NODENAME="$(name "$n")" \
    RABBITMQ_NODE_PORT="$(amqp_port "$n")" \
    RABBITMQ_DIST_PORT=$((25680 + n)) \
    RABBITMQ_MNESIA_BASE="$d/mnesia" \
    RABBITMQ_LOG_BASE="$d/log" \
    RABBITMQ_PID_FILE="$d/pid" \
    RABBITMQ_CONFIG_FILE="$d/rabbitmq.conf" \
    RABBITMQ_ENABLED_PLUGINS_FILE="$d/enabled_plugins" \
    ERL_FLAGS="-kernel inet_dist_use_interface {127,0,0,1}" \
    "$bin/rabbitmq-server" </dev/null >>"$d/server.log" 2>&1
}

wait_up() {
  local n=$1
  # `await_startup` fails at once while the node has not registered its
  # name yet.
  local i
  for i in $(seq 1 90); do
    ctl "$n" await_startup --timeout 90 >/dev/null 2>&1 && return 0
    # Gone after it had time to appear: it failed.
    [ "$i" -lt 10 ] || [ -n "$(pid "$n")" ] || break
    sleep 1
  done
  echo "node $n did not start in 90 s; the end of its logs:" >&2
  tail -n 20 "$root/n$n/server.log" "$root/n$n/log/"*.log >&2 2>/dev/null || true
  return 1
}

stop_all() {
  for n in "${nodes[@]}"; do
    p="$(pid "$n")"
    [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true
  done
  for n in "${nodes[@]}"; do
    for _ in $(seq 1 50); do [ -z "$(pid "$n")" ] && break; sleep 0.1; done
  done
  rm -rf "$root"
}

case "${1:-}" in
  start)
    [ -x "$bin/rabbitmq-server" ] || { echo "RabbitMQ is not installed (package rabbitmq-server)" >&2; exit 1; }
    stop_all
    for n in "${nodes[@]}"; do configure "$n"; done
    for n in "${nodes[@]}"; do launch "$n"; done
    for n in "${nodes[@]}"; do wait_up "$n"; done
    for n in 2 3; do
      ctl "$n" stop_app
      ctl "$n" join_cluster "$(name 1)"
      ctl "$n" start_app
    done
    ctl 1 await_online_nodes 3 --timeout 60 >/dev/null
    ;;
  kill)
    n="${2:?kill N}"
    p="$(pid "$n")"
    [ -n "$p" ] || { echo "node $n is not running" >&2; exit 1; }
    kill -9 "$p"
    for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    ;;
  restart)
    n="${2:?restart N}"
    [ -n "$(pid "$n")" ] || launch "$n"
    wait_up "$n"
    ;;
  stop) stop_all ;;
  url) url "${2:?url N}" ;;
  urls)
    list=()
    for n in "${nodes[@]}"; do list+=("$(url "$n")"); done
    (IFS=,; echo "${list[*]}")
    ;;
  *)
    echo "usage: $0 start | kill N | restart N | stop | url N | urls" >&2
    exit 2
    ;;
esac
