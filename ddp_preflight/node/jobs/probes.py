"""Runs ON every node, in each rank under torchrun (`-m ddp_preflight.node.jobs.probes`; torch and the standard
library): the probes that need torch, in one job per node, every node at once (issue 36: each
torch import costs seconds, and three jobs paid it three times, the compute one node by node).

In order, each part only when its option is given:
1. compute (--compute JSON: the compute program's spec per node rank, or null): once every rank of
   the job has torch (a signed barrier on torchrun's store, so no import contends with the figure),
   each node's local rank 0 runs the compute program's benchmark (node/jobs/compute.py) while the
   node's other ranks wait; all nodes measure at the same moment.
2. collectives (--collectives JSON: that job's options): node/jobs/collectives.py in every rank.
   A rank whose group cannot form or breaks ends there, as that job does: the master then runs
   bandwidth alone.
3. bandwidth (--bandwidth JSON: that job's options): node/jobs/bandwidth.py in a process group of
   its own (keys under "bandwidth/" in the store), with torchrun's environment as it was before the
   collectives changed the interface; with --bandwidth-per-node one rank per node (each node's
   local rank 0, as the bandwidth probe measures the links between nodes). Nodes may run
   different counts of ranks (a hostfile's slots): each runs as many as training will there.

Each part prints its own marked lines, as its own job does; the master reads them per probe."""

import argparse
import datetime
import json
import os
import sys

from ddp_preflight.node import protocol, signing

BARRIER_SECONDS = 60.0     # every rank's torch import, then each node's benchmark


def barrier(store, name: str, rank: int, world: int) -> bool:
    """Every rank of the job reached `name` (signed keys, as every value of this store)."""
    keys = ["probes/%s/%d" % (name, r) for r in range(world)]
    store.set(keys[rank], "1")
    try:
        store.wait(keys, datetime.timedelta(seconds=BARRIER_SECONDS))
    except Exception:
        return False
    return True


def compute_part(specs: list, rank: int, world: int, node_rank: int, local_rank: int) -> None:
    spec = specs[node_rank] if local_rank == 0 else None
    if spec and not spec.get("threads") and spec.get("device") != "cuda":
        # The benchmark measures with torch's own thread count there (no OMP_NUM_THREADS in the
        # training's environment, one process per node): not the one preflight gives the job's ranks.
        os.environ.pop("OMP_NUM_THREADS", None)
    from ddp_preflight.node.jobs import compute, signed_store  # torch, from here on

    store = signed_store.rank_store(datetime.timedelta(seconds=BARRIER_SECONDS))
    ready = barrier(store, "imported", rank, world)
    signed_store.stop_if_interfered("rank %d" % rank)
    if spec:
        try:
            compute.main(spec)
        except Exception as exc:     # the benchmark's failure is its figure's error, not the job's end
            protocol.emit(protocol.COMPUTE, {"error": "%s: %s" % (type(exc).__name__, exc)})
    if ready:
        barrier(store, "computed", rank, world)
        signed_store.stop_if_interfered("rank %d" % rank)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--compute")
    parser.add_argument("--collectives")
    parser.add_argument("--bandwidth")
    parser.add_argument("--bandwidth-per-node", action="store_true")
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, node_rank = int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("GROUP_RANK", "0"))
    # Each part starts with torchrun's environment: each takes the store's token out of it (its
    # children do not inherit it), and the collectives set the interface their way.
    as_started = dict(os.environ)
    if args.compute:
        compute_part(json.loads(args.compute), rank, world, node_rank, local_rank)
        os.environ.clear()
        os.environ.update(as_started)
    if args.collectives:
        from ddp_preflight.node.jobs import collectives
        sys.argv = ["collectives", *json.loads(args.collectives)]
        collectives.main()
        os.environ.clear()
        os.environ.update(as_started)
    if args.bandwidth and (local_rank == 0 or not args.bandwidth_per_node):
        from ddp_preflight.node.jobs import bandwidth
        if args.bandwidth_per_node:
            # torchrun's nodes (they may run different counts); a torchrun that does not say: even counts
            nodes = int(os.environ.get("GROUP_WORLD_SIZE") or world // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
            bandwidth.main(json.loads(args.bandwidth), rank=node_rank, world=nodes, prefix="bandwidth/")
        else:
            bandwidth.main(json.loads(args.bandwidth), rank=rank, world=world, prefix="bandwidth/")


if __name__ == "__main__":
    signing.key_from_environment()
    try:
        main()
    except BaseException:
        from ddp_preflight.node.jobs import signed_store
        signed_store.stop_if_interfered("rank %s" % os.environ.get("RANK"))
        raise
    # Every part said what it found and closed its group: the interpreter's teardown with torch
    # loaded (its modules, its threads, Gloo's) measures nothing, and torchrun waits for it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
