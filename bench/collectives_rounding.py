"""The collectives job's tolerance against real Gloo arithmetic, at every world size from 2 to 32:
every real reduction it must accept, and the wrong results it must catch.

One torchrun job of 32 ranks on this machine (Gloo over loopback, CPU); a group of each size W
(dist.new_group of ranks 0..W-1) runs the job's reductions with the job's values, in float32,
bfloat16 and float16: all_reduce SUM and AVG, reduce_scatter_tensor and reduce_scatter. Then the
same reductions with one rank sending zeros (the smallest contribution, rank 0, or the largest,
rank W-1): a missing rank. The results are judged here as the job judges them
(expected_reduction, within):

- real: the share of real results within the tolerance (must be 100%), and the largest error
  seen as a fraction of the tolerance, per dtype;
- caught: the share of wrong results the tolerance rejects: a missing rank, and each rank's real
  shard taken for its neighbour's (an off-by-one shard), per dtype.

python bench/collectives_rounding.py [--record FILE]   (FILE: the real results, as the ranks got
them: tests/unit/artifacts/gloo_reductions.json was recorded so)"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddp_preflight.node.jobs import collectives as job  # noqa: E402

MAX_WORLD = 32
DTYPES = ("float32", "bfloat16", "float16")
MARKER = "GLOO_REDUCTION "
MISSING_OPS = ("all_reduce_sum", "all_reduce_avg", "reduce_scatter_tensor")


def worker() -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for world in range(2, dist.get_world_size() + 1):
        group = dist.new_group(list(range(world)))      # every rank takes part in creating it
        if rank >= world:
            continue
        for name in DTYPES:
            dtype = getattr(torch, name)
            for missing in (None, 0, world - 1):
                # A missing rank sends zeros: what a reduction that lost its contribution returns.
                scale = 0.0 if rank == missing else 1.0
                cases: dict = dict.fromkeys(MISSING_OPS if missing is not None else (*MISSING_OPS, "reduce_scatter"))
                for op in cases:
                    if op.startswith("all_reduce"):
                        t = job._full((rank + 1) * scale, dtype, "cpu")
                        reduce_op = dist.ReduceOp.SUM if op == "all_reduce_sum" else dist.ReduceOp.AVG
                        dist.all_reduce(t, op=reduce_op, group=group)
                    else:
                        shards = [job._full((rank + 1 + j) * scale, dtype, "cpu") for j in range(world)]
                        t = torch.empty(job.N, dtype=dtype)
                        if op == "reduce_scatter":
                            dist.reduce_scatter(t, shards, group=group)
                        else:
                            dist.reduce_scatter_tensor(t, torch.cat(shards), group=group)
                    cases[op] = t.float().tolist()
                sys.stdout.write(MARKER + json.dumps({"world": world, "dtype": name, "missing": missing,
                                                      "rank": rank, "got": cases}) + "\n")
    sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()


def collect(max_world: int) -> list[dict]:
    """{world, dtype, missing, op, got: [[values] per rank]} for every case, rank by rank."""
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               f"--nproc-per-node={max_world}", __file__, "--worker"],
                              capture_output=True, text=True, timeout=900, cwd=tmp,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise SystemExit(f"the torchrun job failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rows: dict[tuple, dict] = {}
    for line in done.stdout.splitlines():
        if not line.startswith(MARKER):
            continue
        r = json.loads(line[len(MARKER):])
        for op, got in r["got"].items():
            row = rows.setdefault((r["world"], r["dtype"], r["missing"], op),
                                  {"world": r["world"], "dtype": r["dtype"], "missing": r["missing"], "op": op,
                                   "got": [None] * r["world"]})
            row["got"][r["rank"]] = got
    return list(rows.values())


def compact(values: list[float]) -> float | int | list:
    one = values[0] if len(set(values)) == 1 else None
    if one is None:
        return values
    return int(one) if one == int(one) else one


def judge(rows: list[dict]) -> dict:
    """Per dtype: real results accepted, the worst error as a share of the tolerance, wrong results
    caught (a missing rank; a neighbour's shard), and per operation the world sizes at which some
    missing rank went uncaught."""
    out = {name: {"real": [0, 0], "worst": 0.0, "missing": [0, 0], "shard": [0, 0], "missed_at": {}}
           for name in DTYPES}
    for row in rows:
        dtype, world, stats = getattr(torch, row["dtype"]), row["world"], out[row["dtype"]]
        for rank, values in enumerate(row["got"]):
            got = torch.tensor(values)
            want, rtol = job.expected_reduction(row["op"], rank, world, dtype)
            ok = job.within(got, want, rtol)
            if row["missing"] is not None:
                stats["missing"][0] += not ok
                stats["missing"][1] += 1
                if ok:
                    stats["missed_at"].setdefault(row["op"], set()).add(world)
                continue
            stats["real"][0] += ok
            stats["real"][1] += 1
            error = float((got.double() - want).abs().max()) / want
            stats["worst"] = max(stats["worst"], error / rtol if rtol else (error and float("inf")))
            if row["op"].startswith("reduce_scatter"):
                # The same real values taken for the next rank's shard.
                other, other_rtol = job.expected_reduction(row["op"], (rank + 1) % world, world, dtype)
                stats["shard"][0] += not job.within(got, other, other_rtol)
                stats["shard"][1] += 1
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--record")
    parser.add_argument("--max-world", type=int, default=MAX_WORLD)
    args = parser.parse_args()
    if args.worker:
        worker()
        return 0
    rows = collect(args.max_world)
    if args.record:
        Path(args.record).write_text(json.dumps({
            "source": f"bench/collectives_rounding.py --record, torch {torch.__version__}, Gloo on CPU, one "
                      f"torchrun of {args.max_world} ranks on one machine, a group of each size",
            "format": "'WORLD DTYPE OP': per rank, the values it got, or one number when they are all the same",
            "results": {f"{row['world']} {row['dtype']} {row['op']}": [compact(g) for g in row["got"]]
                        for row in rows if row["missing"] is None}}, separators=(",", ":")) + "\n")
    failed = False
    for name, s in judge(rows).items():
        real, missing, shard = s["real"], s["missing"], s["shard"]
        failed |= real[0] != real[1]
        every = ", ".join(f"{op} {min(s['missed_at'].get(op, {args.max_world + 1})) - 1}" for op in MISSING_OPS)
        print(f"{name:9} W=2..{args.max_world}: real results within the tolerance {real[0]}/{real[1]} "
              f"(worst error {s['worst']:.2f} of the tolerance); caught: a missing rank {missing[0]}/{missing[1]} "
              f"(every one up to W = {every}), a neighbour's shard {shard[0]}/{shard[1]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
