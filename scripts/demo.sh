#!/usr/bin/env bash
# The main job on the lab: bring up two "machines", preflight them, train a step across them
# over SSH with torchrun and Gloo, then break them the way real multi-node runs break and let
# preflight say what is wrong and how to fix it; then launch a 2-node x 2-rank training from the
# master whose rank 3 leaves the loop early, let hangwatch name it and explain say it again from the
# run's logs. Tears everything down at the end, whatever happens, and leaves nothing behind (its
# run folder is removed too).
# DDP_PREFLIGHT_LAB names the lab (default: demo), so it can run beside another.
set -euo pipefail
PY=${1:-python3}
PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")
cd "$(dirname "$0")/.."
export DDP_PREFLIGHT_LAB=${DDP_PREFLIGHT_LAB:-demo}
cli() { "$PY" -m ddp_preflight "$@"; }
RUNS=$(mktemp -d)
trap 'cli lab down; rm -rf "$RUNS"' EXIT

cli lab up --nodes 2
status() { cli lab status --json | "$PY" -c "import json,sys; s=json.load(sys.stdin); print($1)"; }
export DDP_PREFLIGHT_SSH_CONFIG=$(status 's["ssh_config"]')
MASTER=$(status 's["nodes"][0]["ipv4"]')
DATA=$(status 's["data_dir"]')
JOB=$(pwd)/examples/allreduce.py

step() {  # one DDP step on both nodes over ssh, as a user would run torchrun on each
  local rank=0 pids=()
  for node in master worker1; do
    ssh -F "$DDP_PREFLIGHT_SSH_CONFIG" "$node" "PG_TIMEOUT=${1:-30} $PY -m torch.distributed.run --nnodes 2 \
      --nproc-per-node 1 --node-rank $rank --master-addr $MASTER --master-port 29500 $JOB" \
      2>/dev/null | sed "s/^/[$node] /" &
    pids+=($!); rank=$((rank + 1))
  done
  for pid in "${pids[@]}"; do wait "$pid" || true; done
}

echo; echo "== preflight on a clean lab =="
cli master worker1 --data-dir "$DATA" -- "$JOB"
echo; echo "== so a two-node all_reduce over Gloo works =="
step

echo; echo "== now what breaks real runs: a Tailscale IPv6 address on worker1, Wi-Fi, uneven data shards,"
echo "== a leftover process on port 29500, and the script's options placed where torchrun takes them =="
cli lab fault add vpn-ipv6@worker1 wifi@worker1 shards@worker1 port-busy@master
cli master worker1 --data-dir "$DATA" -- -m examples.train_ddp --run=demo || echo "(preflight exit code $?: not ready)"

echo; echo "== what training would have hit: the IPv6 fault alone =="
cli lab fault clear
cli lab fault add vpn-ipv6@worker1
step 10
cli lab fault clear

echo; echo "== launch from the master: preflight, then 4 ranks on 2 nodes; rank 3 leaves the loop at step 5"
echo "== while the others wait in their next all_reduce. hangwatch names it; --stop-on-hang then stops every node =="
cli master worker1 --no-probes --nproc-per-node 2 --launch --stop-on-hang --log-dir "$RUNS/run" \
  -- examples/hang_train.py --steps 300 --fault leave --rank 3 --at 5 2>&1 \
  | grep -v -e "^\[.*\] \(W\|E\|I\)[0-9]\{4\} " -e "socket.cpp" -e NumPy -e _conversion_method || true

echo; echo "== after the fact, from what the run left (its logs, Flight Recorder dumps, the bundle): explain =="
cli explain "$RUNS/run" || true
echo "(the demo removes its run folder with the lab; a run of your own keeps it: ddp-preflight explain FOLDER)"
