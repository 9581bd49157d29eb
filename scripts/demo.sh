#!/usr/bin/env bash
# The main job on the lab: bring up two "machines", train-step across them over SSH with
# torchrun and Gloo, show what a seed fault does, and tear everything down again.
set -euo pipefail
PY=${1:-python3}
PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")
cd "$(dirname "$0")/.."
export DDP_PREFLIGHT_LAB=demo
cli() { "$PY" -m preflight "$@"; }
trap 'cli lab down' EXIT

cli lab up --nodes 2
CONFIG=$(cli lab status --json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["ssh_config"])')
MASTER=$(cli lab status --json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["nodes"][0]["ipv4"])')
JOB=$(pwd)/examples/allreduce.py

step() {  # run one DDP step on both nodes over ssh, as a user would with torchrun
  local rank=0 pids=()
  for node in master worker1; do
    ssh -F "$CONFIG" "$node" "PG_TIMEOUT=${1:-30} $PY -m torch.distributed.run --nnodes 2 \
      --nproc-per-node 1 --node-rank $rank --master-addr $MASTER --master-port 29500 $JOB" \
      2>/dev/null | sed "s/^/[$node] /" &
    pids+=($!); rank=$((rank + 1))
  done
  for pid in "${pids[@]}"; do wait "$pid" || true; done
}

echo; echo "== a clean two-node all_reduce over Gloo =="
step
echo; echo "== worker1 with a Tailscale-style IPv6-only VPN (seed 004) =="
cli lab fault add vpn-ipv6@worker1
step 10
cli lab fault clear
