#!/usr/bin/env bash
# A 3-node NATS cluster with JetStream on loopback, for the node-loss
# scenarios, apart from the machine's own nats-server (port 4222).
#
#   scripts/nats-cluster.sh start      a fresh cluster: clients on 14222-14224,
#                                      routes on 16222-16224, monitoring on
#                                      18222-18224; waits until every node is
#                                      healthy with JetStream
#   scripts/nats-cluster.sh kill N     SIGKILL node N (1-3)
#   scripts/nats-cluster.sh restart N  start node N again (its store kept)
#   scripts/nats-cluster.sh stop       stop every node and remove the stores
#   scripts/nats-cluster.sh url N      node N's client URL
#
# Each node has its store under target/nats-cluster/nN and the server name
# nN; a client connected to one node learns the others from it.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
root="${NATS_CLUSTER_DIR:-$here/target/nats-cluster}"
nodes=(1 2 3)

client_port() { echo $((14221 + $1)); }
route_port() { echo $((16221 + $1)); }
monitor_port() { echo $((18221 + $1)); }
pid() { { pgrep -f -- "--store_dir $root/n$1( |$)" || true; } | head -n1; }

launch() {
  local n=$1 routes
  routes="$(for k in "${nodes[@]}"; do printf 'nats://127.0.0.1:%s,' "$(route_port "$k")"; done)"
  mkdir -p "$root/n$n"
  setsid -f nats-server -a 127.0.0.1 -p "$(client_port "$n")" -m "$(monitor_port "$n")" \
    --server_name "n$n" --cluster_name inbox-test \
    --cluster "nats://127.0.0.1:$(route_port "$n")" --routes "${routes%,}" \
    -js --store_dir "$root/n$n" </dev/null >>"$root/n$n.log" 2>&1
}

healthy() {
  curl -fsS "http://127.0.0.1:$(monitor_port "$1")/healthz" 2>/dev/null | grep -q '"ok"'
}

wait_healthy() {
  for _ in $(seq 1 300); do
    local all=1
    for n in "$@"; do healthy "$n" || all=0; done
    [ "$all" = 1 ] && return 0
    sleep 0.1
  done
  echo "the cluster's nodes $* were not healthy within 30 s; the end of their logs:" >&2
  for n in "$@"; do tail -n 10 "$root/n$n.log" >&2; done
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
    command -v nats-server >/dev/null || { echo "nats-server is not installed (package nats-server)" >&2; exit 1; }
    stop_all
    mkdir -p "$root"
    for n in "${nodes[@]}"; do launch "$n"; done
    wait_healthy "${nodes[@]}"
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
    wait_healthy "$n"
    ;;
  stop) stop_all ;;
  url) echo "nats://127.0.0.1:$(client_port "${2:?url N}")" ;;
  *)
    echo "usage: $0 start | kill N | restart N | stop | url N" >&2
    exit 2
    ;;
esac
