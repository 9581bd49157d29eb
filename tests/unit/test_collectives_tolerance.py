"""The collectives job's tolerance (issue 10): a reduction is compared with the bound its dtype and
world size allow, so real rounding is never "wrong", and a missing rank or a wrong shard still is.

Real arithmetic, no process group: the results real Gloo returned at 2 to 32 ranks (recorded by
bench/collectives_rounding.py in artifacts/gloo_reductions.json), and sums computed here in the
dtype itself in every order a backend may take."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ddp_preflight.node.jobs import collectives as job

REAL = Path(__file__).parent / "artifacts" / "gloo_reductions.json"
WORLDS = range(2, 33)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SUMS = ("all_reduce_sum", "reduce_scatter_tensor")


def real_results():
    """(world, dtype, op, rank, values) for every result a rank got."""
    for key, per_rank in json.loads(REAL.read_text())["results"].items():
        world, dtype, op = key.split()
        for rank, got in enumerate(per_rank):
            yield int(world), getattr(torch, dtype), op, rank, got if isinstance(got, list) else [got] * job.N


def sent(op: str, rank: int, world: int, dtype) -> list[list[float]]:
    """What each rank sends, as rounded to the dtype: per rank, its term for this rank's result."""
    value = (lambda r: r + 1 + rank) if op.startswith("reduce_scatter") else (lambda r: r + 1)
    return [job._sent(value(r), dtype) for r in range(world)]


def summed(rows: torch.Tensor, dtype) -> torch.Tensor:
    """Each row's terms added left to right in the dtype, rounding after every addition as a
    backend's reduction step does."""
    rows = rows.to(dtype)
    acc = rows[:, 0].clone()
    for k in range(1, rows.shape[1]):
        acc = acc + rows[:, k]
    return acc


def sums_in_every_order(terms: list[float], dtype) -> torch.Tensor:
    """The sum in each order a backend may take: a ring starting at each rank, either way round;
    smallest and largest first; a pairwise tree."""
    w = len(terms)
    x = torch.tensor(terms, dtype=torch.float64)
    orders = [torch.roll(x, -s) for s in range(w)] + [torch.roll(x.flip(0), -s) for s in range(w)]
    orders += [x.sort().values, x.sort(descending=True).values]
    tree = x.to(dtype)
    while len(tree) > 1:
        tree = torch.cat([tree[0:len(tree) - 1:2] + tree[1::2], tree[len(tree) - len(tree) % 2:]])
    return torch.cat([summed(torch.stack(orders), dtype), tree])


def caught(results: torch.Tensor, want: float, rtol: float) -> bool:
    """Whether the tolerance rejects every one of these results."""
    return not any(job.within(r.reshape(1), want, rtol) for r in results.unique())


def test_every_real_gloo_reduction_at_2_to_32_ranks_is_within_the_tolerance():
    checked = rounded = 0
    for world, dtype, op, rank, got in real_results():
        want, rtol = job.expected_reduction(op, rank, world, dtype)
        assert job.within(torch.tensor(got), want, rtol), (world, dtype, op, rank, got, want, rtol)
        checked += 1
        rounded += got != [want] * job.N
    assert checked == 4 * sum(WORLDS) * len(DTYPES)
    assert rounded > 50       # real rounding is in there, not only exact results
    # Issue 10's case: 16 ranks, bfloat16, rank 15's shard. The old fixed 1% tolerance failed it.
    key = "16 bfloat16 reduce_scatter_tensor"
    assert json.loads(REAL.read_text())["results"][key][15] == 380
    assert job.expected_reduction("reduce_scatter_tensor", 15, 16, torch.bfloat16)[0] == 376
    assert not torch.allclose(torch.tensor([380.0]), torch.tensor([376.0]), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_bound_holds_for_a_sum_in_any_order(dtype):
    for world in WORLDS:
        for op in ("all_reduce_sum", "reduce_scatter_tensor"):
            for rank in range(world):
                want, rtol = job.expected_reduction(op, rank, world, dtype)
                got = sums_in_every_order(sent(op, rank, world, dtype), dtype)
                assert job.within(got, want, rtol), (world, op, rank, got.max().item(), want, rtol)
    # AVG: the sum, then one more rounding for the division.
    for world in WORLDS:
        want, rtol = job.expected_reduction("all_reduce_avg", 0, world, dtype)
        got = sums_in_every_order(sent("all_reduce_avg", 0, world, dtype), dtype) / world
        assert job.within(got.to(dtype), want, rtol), (world, want, rtol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_missing_rank_and_another_ranks_shard_are_caught_wherever_the_dtype_can_tell(dtype):
    rounding = set()      # (op, world) where some rank's result may round
    for world in WORLDS:
        for op in SUMS:
            for rank in range(world) if op == "reduce_scatter_tensor" else (0,):   # every rank sums the same
                want, rtol = job.expected_reduction(op, rank, world, dtype)
                if rtol:
                    rounding.add((op, world))
                terms = sent(op, rank, world, dtype)
                # Where the dtype holds the total exactly (tolerance 0), and always in float32,
                # every rank's contribution counts.
                if (rtol == 0 or dtype == torch.float32) and rank in (0, world - 1):   # the smallest and largest shard
                    lost = torch.tensor(terms).repeat(world, 1).fill_diagonal_(0.0)   # row m: rank m lost
                    assert caught(summed(lost, dtype), want, rtol), (world, op, rank)
                    if op == "reduce_scatter_tensor":
                        neighbour = sums_in_every_order(sent(op, (rank + 1) % world, world, dtype), dtype)
                        assert caught(neighbour, want, rtol), (world, rank)
                # A reduction that did not happen (each rank keeps its own term) is caught everywhere.
                assert not job.within(torch.tensor([terms[rank]] * job.N), want, rtol), (world, op, rank)
    exact_up_to = {op: min((w for o, w in rounding if o == op), default=WORLDS[-1] + 1) - 1 for op in SUMS}
    # How far the exact regime reaches (docs/checks/collectives.md says so): float32 and float16
    # past 32 ranks; bfloat16, whose integers stop at 256, to 22 ranks for all_reduce, 13 for
    # reduce_scatter, and within 6.2% at 16 ranks, 14% at 32 beyond them.
    assert exact_up_to == ({op: 32 for op in SUMS} if dtype != torch.bfloat16 else
                           {"all_reduce_sum": 22, "reduce_scatter_tensor": 13})
    if dtype == torch.bfloat16:
        assert f"{job.expected_reduction('reduce_scatter_tensor', 15, 16, dtype)[1]:.3f}" == "0.062"
        assert f"{job.expected_reduction('reduce_scatter_tensor', 0, 32, dtype)[1]:.3f}" == "0.138"


def test_copies_are_exact_and_nan_is_never_within():
    sent_values = job._full(3, torch.bfloat16, "cpu")
    assert job.within(sent_values.clone(), sent_values)
    assert not job.within(sent_values + 1, sent_values)          # 4 for 3: a copy never rounds
    assert not job.within(torch.tensor([float("nan")] * job.N), 3.0, job.reduction_tolerance(torch.bfloat16, 300))
