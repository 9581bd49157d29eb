"""The probes on GPUs: what they decide from the facts before any job starts (on the recorded
H100 host, one GPU, and on derived two-GPU facts, marked), how they read a failed NCCL job
(the recorded two-ranks-one-GPU run), and the compute program's GPU branch on this machine,
which has no CUDA: it reports torch's own error. The branch itself has not run on a GPU."""

from __future__ import annotations

import sys

from ddp_preflight.node import protocol
from ddp_preflight.preflight.probes import bandwidth, compute, gpus
from ddp_preflight.preflight.probes.torchjob import exception_line
from ddp_preflight.transport import LocalNode

from . import facts_fixtures as ff
from . import gpu_fixtures as g

DUPLICATE = "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 60"


def decide(ctx):
    """Each probe's decision for this context: (collectives, bandwidth, compute)."""
    usable = list(range(len(ctx.nodes)))
    return (gpus.collective_plan(ctx.nodes, ctx.options, usable), bandwidth.plan(ctx.nodes, ctx.options, usable),
            gpus.cuda_blocked(ctx.nodes, ctx.options, usable))


# --- before any job starts ---------------------------------------------------------------------

def test_two_ranks_on_the_recorded_one_gpu_host_start_no_job_and_name_gpu_visible():
    collectives, bandwidth_plan, compute = decide(g.context(("h100", g.h100()), nproc_per_node=2))

    reason = "2 ranks per node but h100 sees 1 GPU: the ranks past the GPUs would fail (see gpu-visible)"
    assert collectives.skipped == bandwidth_plan.skipped == compute == reason
    assert "firewall" not in reason and "ephemeral" not in reason


def test_every_node_short_of_gpus_is_named():
    # DERIVED: a second host like the recorded one, as worker1.
    _, _, compute = decide(g.context(("master", g.h100()), ("worker1", g.h100()), nproc_per_node=2))
    assert compute.startswith("2 ranks per node but master sees 1 GPU, worker1 sees 1 GPU:")


def test_one_rank_on_the_one_gpu_host_says_why_nothing_is_exchanged():
    collectives, bandwidth_plan, compute = decide(g.context(("h100", g.h100()), nproc_per_node=1))

    assert collectives.skipped == bandwidth_plan.skipped == (
        f"one GPU in the run (h100's): nothing to exchange within it, and NCCL cannot put two ranks on one GPU "
        f"('{DUPLICATE}'); give a second node")
    assert DUPLICATE in g.recording("two-ranks-one-gpu.txt")
    assert compute is None          # one GPU still has its matmul rate measured


def test_two_gpus_run_one_rank_each():
    two = g.second_gpu(g.h100())        # DERIVED: a second H100, both seen by torch
    for nproc in (1, 2):
        collectives, bandwidth_plan, compute = decide(g.context(("h100", two), nproc_per_node=nproc))
        assert (collectives.counts, collectives.skipped) == ((2,), None)
        assert (bandwidth_plan.counts, bandwidth_plan.skipped) == ((2,), None)
        assert compute is None


def test_two_one_gpu_nodes_run_one_rank_per_node():
    # DERIVED: a second host like the recorded one, as worker1.
    collectives, bandwidth_plan, compute = decide(g.context(("master", g.h100()), ("worker1", g.h100())))
    assert (collectives.counts, bandwidth_plan.counts, compute) == ((1, 1), (1, 1), None)


def test_a_cuda_run_on_the_labs_cpu_nodes_starts_nothing_and_points_at_device_dtype():
    collectives, bandwidth_plan, compute = decide(ff.context(ff.clean(), device="cuda", backend="nccl",
                                                             nproc_per_node=2))
    reason = "no node has a CUDA device (see device-dtype)"
    assert collectives.skipped == bandwidth_plan.skipped == compute == reason


def test_a_node_without_cuda_beside_a_gpu_node_is_device_dtypes():
    # DERIVED: worker1 is the lab's CPU node (its recorded facts), the master the H100 host.
    cpu_worker = ff.facts(ff.clean(), "worker1")
    _, _, compute = decide(g.context(("master", g.h100()), ("worker1", cpu_worker)))
    assert compute == "worker1's torch has no nccl backend (it has: gloo) (see device-dtype)"


def test_cpu_runs_are_decided_as_before():
    ctx = ff.context(ff.clean())
    collectives, bandwidth_plan, compute = decide(ctx)
    assert (collectives.counts, bandwidth_plan.counts, compute) == ((1, 1), (1, 1), None)
    one = ctx.nodes[:1]
    assert gpus.collective_plan(one, ctx.options, [0]).counts == (2,)     # two ranks show what Gloo does
    assert bandwidth.plan(one, ctx.options, [0]).skipped == "needs the master and at least one more reachable node"


# --- a failed job, in the backend's own words ----------------------------------------------------

def test_nccls_own_cause_is_read_out_of_the_recorded_failure():
    error = exception_line(g.recording("two-ranks-one-gpu.txt"))
    assert error.startswith("torch.distributed.DistBackendError: NCCL error in: ")
    assert error.endswith("; Last error: Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 60")
    assert "ChildFailedError" not in error


def test_a_rank_keeps_nccls_own_cause_when_it_reports_its_error():
    from ddp_preflight.node.jobs.collectives import first_line  # the job's module imports torch

    # The message rank 1 raised on the recorded host, as str() of the exception gives it.
    said = [line.removeprefix("[rank1]: ") for line in g.recording("two-ranks-one-gpu.txt").splitlines()
            if line.startswith("[rank1]: ")]
    start = next(i for i, line in enumerate(said) if line.startswith("torch.distributed.DistBackendError: "))
    message = "\n".join([said[start].split(": ", 1)[1], *said[start + 1:start + 4]])
    assert first_line(RuntimeError(message)) == (
        "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:93, invalid usage (run with "
        f"NCCL_DEBUG=WARN for details), NCCL version 2.28.9; Last error: {DUPLICATE}")


# --- the compute program's GPU branch, where there is no GPU -------------------------------------

def test_the_gpu_benchmark_without_cuda_reports_torchs_own_error():
    job = LocalNode("here", sys.executable).job({"program": "compute", "device": "cuda", "gpus": 2, "seconds": 0.1},
                                                timeout=60)
    result = job.wait(90)
    [line] = result.json_lines(protocol.COMPUTE)
    assert line == {"device": "cuda", "error": "GPU 0: RuntimeError: PyTorch was compiled without CUDA support"}
    assert result.exit == 1


def test_the_benchmark_is_asked_for_each_gpu_the_nodes_ranks_use():
    two = g.second_gpu(g.h100())        # DERIVED: a second H100
    for nproc in (1, 2):
        ctx = g.context(("h100", two), nproc_per_node=nproc)
        assert compute.benchmark_spec(ctx.nodes[0], ctx.options, 0.5) == (
            {"program": "compute", "seconds": 0.5, "device": "cuda", "gpus": nproc}, None)


def test_a_hostfiles_own_counts_are_each_nodes_ranks_in_the_collectives_job():
    # master slots=1, worker1 slots=3 (a DeepSpeed hostfile): the collectives run 1 + 3 ranks, as
    # training will; bandwidth measures between the nodes, one rank each.
    ctx = ff.context(ff.clean(), nproc_per_node=1, nprocs={"master": 1, "worker1": 3})
    collectives, bandwidth_plan, _ = decide(ctx)
    assert (collectives.counts, collectives.world, bandwidth_plan.counts) == ((1, 3), 4, (1, 1))
