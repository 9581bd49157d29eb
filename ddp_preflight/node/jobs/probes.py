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
from typing import Optional

from ddp_preflight.node import protocol, signing

BARRIER_SECONDS = 60.0     # every rank's torch import, then each node's benchmark


def barrier(store, name: str, rank: int, world: int, prefix: str = "") -> bool:
    """Every rank of the job reached `name` (signed keys, as every value of this store)."""
    keys = ["%sprobes/%s/%d" % (prefix, name, r) for r in range(world)]
    store.set(keys[rank], "1")
    try:
        store.wait(keys, datetime.timedelta(seconds=BARRIER_SECONDS))
    except Exception:
        return False
    return True


def compute_part(specs: list, rank: int, world: int, node_rank: int, local_rank: int, prefix: str = "") -> None:
    spec = specs[node_rank] if local_rank == 0 else None
    if spec and not spec.get("threads") and spec.get("device") != "cuda":
        # The benchmark measures with torch's own thread count there (no OMP_NUM_THREADS in the
        # training's environment, one process per node): not the one preflight gives the job's ranks.
        os.environ.pop("OMP_NUM_THREADS", None)
    from ddp_preflight.node.jobs import compute, signed_store  # torch, from here on

    store = signed_store.rank_store(datetime.timedelta(seconds=BARRIER_SECONDS))
    ready = barrier(store, "imported", rank, world, prefix)
    signed_store.stop_if_interfered("rank %d" % rank)
    if spec:
        try:
            compute.main(spec)
        except Exception as exc:     # the benchmark's failure is its figure's error, not the job's end
            protocol.emit(protocol.COMPUTE, {"error": "%s: %s" % (type(exc).__name__, exc)})
    if ready:
        barrier(store, "computed", rank, world, prefix)
        signed_store.stop_if_interfered("rank %d" % rank)


def main(argv=None, prefix: str = "") -> None:
    """`prefix`: every store key of the parts goes under it (in_rank)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--compute")
    parser.add_argument("--collectives")
    parser.add_argument("--bandwidth")
    parser.add_argument("--bandwidth-per-node", action="store_true")
    args = parser.parse_args(argv)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, node_rank = int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("GROUP_RANK", "0"))
    # Each part starts with torchrun's environment: each takes the store's token out of it (its
    # children do not inherit it), and the collectives set the interface their way.
    as_started = dict(os.environ)
    if args.compute:
        compute_part(json.loads(args.compute), rank, world, node_rank, local_rank, prefix)
        os.environ.clear()
        os.environ.update(as_started)
    if args.collectives:
        from ddp_preflight.node.jobs import collectives
        sys.argv = ["collectives", *json.loads(args.collectives)]
        collectives.main(prefix or None)
        os.environ.clear()
        os.environ.update(as_started)
    if args.bandwidth and (local_rank == 0 or not args.bandwidth_per_node):
        from ddp_preflight.node.jobs import bandwidth
        if args.bandwidth_per_node:
            # torchrun's nodes (they may run different counts); a torchrun that does not say: even counts
            nodes = int(os.environ.get("GROUP_WORLD_SIZE") or world // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
            bandwidth.main(json.loads(args.bandwidth), rank=node_rank, world=nodes, prefix=prefix + "bandwidth/")
        else:
            bandwidth.main(json.loads(args.bandwidth), rank=rank, world=world, prefix=prefix + "bandwidth/")



IN_RANK_PREFIX = "ddp-preflight-probes/"     # the store keys of the probes inside a launched rank


def in_rank(argv: list) -> Optional[str]:
    """The same parts inside a rank of `ddp-preflight --launch`, before the training's code
    (node/rank_bootstrap.py): one torch import and one rendezvous for the probes and training.

    What the parts change is given back before the training's code runs: the environment (the
    collectives' interface, the compute part's OMP_NUM_THREADS, the store's token), sys.argv and
    torch's thread count; every process group they made is destroyed. Their store keys are under
    IN_RANK_PREFIX: after destroy_process_group the training's own default group is again group
    "0" with the same keys, and must never read the probes'. Returns what a part raised, or None."""
    as_started, argv_as_started = dict(os.environ), list(sys.argv)
    import torch  # as the training's script imports it: with the training's environment

    threads = torch.get_num_threads()
    error = None
    try:
        main(argv, prefix=IN_RANK_PREFIX)
    except Exception as exc:       # that part's figure is missing: the master runs its own job
        import traceback
        traceback.print_exc()
        error = "%s: %s" % (type(exc).__name__, exc)
    finally:
        import gc

        import torch.distributed as dist

        from ddp_preflight.node.jobs import signed_store
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        # Their store clients closed too: hangwatch tells ranks that train alone by the
        # connections they never made, and the script's own connections are all it should see.
        signed_store.forget()
        gc.collect()
        torch.set_num_threads(threads)
        sys.argv[:] = argv_as_started
        os.environ.clear()
        os.environ.update(as_started)
    return error


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
