"""slurm-allocation and slurm-time-left on jobs as the lab's real Slurm 22.05 showed them
(`scontrol show job -d -o`, tests/unit/artifacts/slurm/: how each was made), against the lab's
recorded facts of master and worker1."""

from __future__ import annotations

import dataclasses
import json
from datetime import timezone
from pathlib import Path

from ddp_preflight.preflight.checks import BY_ID, run_checks
from ddp_preflight.preflight.model import NodeFacts
from ddp_preflight.transport.slurm import SlurmShare, parse_job

from .facts_fixtures import clean, context

JOBS = json.loads((Path(__file__).parent / "artifacts" / "slurm" / "jobs.json").read_text())
CHECKS = (BY_ID["slurm-allocation"], BY_ID["slurm-time-left"])


def job(name: str):
    recorded = JOBS[name]
    # The lab's node lists need no expanding; the box printed its times in UTC.
    return parse_job(recorded["scontrol_show_job_d_o"], ("master", "worker1"), {}, lambda s: s.split(","),
                     recorded["read_at"], timezone.utc)


def results(name: str | None, extra_nodes: tuple[NodeFacts, ...] = (), **options):
    ctx = context(clean(), **options)
    ctx = dataclasses.replace(ctx, nodes=ctx.nodes + extra_nodes, slurm=job(name) if name else None)
    return [(r.check, r.status.value, r.node, r.summary, r.fix) for r in run_checks(ctx, CHECKS)]


def test_what_the_job_holds_on_each_node_is_read_from_scontrol():
    gres = job("gres2_c2_t5")
    assert gres.shares == {"master": SlurmShare(2, 2, "gpu:2(IDX:0-1)"), "worker1": SlurmShare(2, 2, "gpu:2(IDX:0-1)")}
    assert (gres.num_tasks, gres.tasks_per_node, gres.cpus_per_task, gres.tres_per_node) == (2, 1, 2, "gres:gpu:2")
    assert (gres.time_limit, gres.end_time, gres.seconds_left) == ("00:05:00", "2026-11-25T06:56:50", 300.0)
    # -n 3 on two nodes of 2 CPUs: one group per set of nodes alike.
    assert job("hetero_n3").shares == {"master": SlurmShare(2, 0, ""), "worker1": SlurmShare(1, 0, "")}
    plain = job("plain")
    assert (plain.time_limit, plain.end_time, plain.seconds_left) == ("UNLIMITED", "Unknown", None)
    assert job("gpn1_t30").shares["worker1"] == SlurmShare(1, 1, "gpu:1(IDX:0)")


def test_outside_a_slurm_job_both_skip():
    skip = "not run through a Slurm job (--slurm-job ID, or --slurm inside salloc or sbatch)"
    assert results(None) == [("slurm-allocation", "skip", None, skip, None),
                             ("slurm-time-left", "skip", None, skip, None)]


def test_salloc_n2_has_one_cpu_per_node_for_two_ranks_a_warning_with_the_options_that_fix_it():
    fix = ("salloc -N 2 --ntasks-per-node 1 --cpus-per-task 2   # or sbatch with the same options; "
           "or fewer ranks: --nproc-per-node 1")
    assert results("plain", nproc_per_node=2) == [
        ("slurm-allocation", "warn", "master",
         "1 CPU of Slurm job 2 on master for 2 ranks: the ranks take turns on it", fix),
        ("slurm-allocation", "warn", "worker1",
         "1 CPU of Slurm job 2 on worker1 for 2 ranks: the ranks take turns on it", fix),
        ("slurm-time-left", "pass", None, "Slurm job 2 has no time limit (TimeLimit=UNLIMITED)", None)]
    # One rank per node fits the same job.
    assert results("plain")[:2] == [
        ("slurm-allocation", "pass", "master", "1 CPU of Slurm job 2 for 1 rank; 1 task per node", None),
        ("slurm-allocation", "pass", "worker1", "1 CPU of Slurm job 2 for 1 rank; 1 task per node", None)]


def test_uneven_cpus_warn_only_on_the_node_short_of_them():
    assert results("hetero_n3", nproc_per_node=2)[:2] == [
        ("slurm-allocation", "pass", "master", "2 CPUs of Slurm job 6 for 2 ranks", None),
        ("slurm-allocation", "warn", "worker1",
         "1 CPU of Slurm job 6 on worker1 for 2 ranks: the ranks take turns on it",
         "salloc -N 2 --ntasks-per-node 1 --cpus-per-task 2   # or sbatch with the same options; "
         "or fewer ranks: --nproc-per-node 1")]


def test_tasks_per_node_that_fit_neither_launch_layout_warn():
    # --ntasks-per-node 2 fits 2 ranks per node (a task per rank), not 4.
    assert results("ntpn2_t60", nproc_per_node=2)[0] == (
        "slurm-allocation", "pass", "master", "2 CPUs of Slurm job 5 for 2 ranks; 2 tasks per node", None)
    assert results("ntpn2_t60", nproc_per_node=4)[0] == (
        "slurm-allocation", "warn", "master",
        "2 CPUs of Slurm job 5 on master for 4 ranks: the ranks take turns on them; Slurm plans 2 tasks per node "
        "and preflight 4 ranks per node: neither one torchrun per node (1 task) nor one task per rank (4)",
        "salloc -N 2 --ntasks-per-node 1 --cpus-per-task 4   # or sbatch with the same options; "
        "or fewer ranks: --nproc-per-node 2")


def test_gpus_per_node_from_gres_against_ranks_on_a_gpu_run():
    gpu = {"device": "cuda", "backend": "nccl", "nproc_per_node": 2}
    assert results("gres2_c2_t5", **gpu)[:2] == [
        ("slurm-allocation", "pass", "master", "2 CPUs and 2 GPUs of Slurm job 3 for 2 ranks; 1 task per node", None),
        ("slurm-allocation", "pass", "worker1", "2 CPUs and 2 GPUs of Slurm job 3 for 2 ranks; 1 task per node", None)]
    assert results("gres2_c2_t5", device="cuda", backend="nccl", nproc_per_node=4)[1] == (
        "slurm-allocation", "fail", "worker1",
        "2 GPUs of Slurm job 3 on worker1 for 4 ranks of a GPU run; "
        "2 CPUs of Slurm job 3 on worker1 for 4 ranks: the ranks take turns on them",
        "salloc -N 2 --gpus-per-node 4 --ntasks-per-node 1 --cpus-per-task 4   # or sbatch with the same options; "
        "or fewer ranks: --nproc-per-node 2")
    # A job that asked for no GPU: nothing but more GPUs fixes it.
    assert results("ntpn2_t60", **gpu)[0] == (
        "slurm-allocation", "fail", "master",
        "0 GPUs of Slurm job 5 on master for 2 ranks of a GPU run (it asked for none: no --gpus-per-node or --gres)",
        "salloc -N 2 --gpus-per-node 2   # or sbatch with the same options")
    # The same job on a CPU run: its GPUs are no concern.
    assert results("gpn1_t30", nproc_per_node=1)[0] == (
        "slurm-allocation", "pass", "master", "1 CPU and 1 GPU of Slurm job 4 for 1 rank; 1 task per node", None)


def test_a_host_that_is_not_a_node_of_the_job_fails_naming_it():
    stranger = NodeFacts("worker2", error="worker2: not a node of Slurm job 2 (its nodes: master,worker1)")
    assert results("plain", (stranger,))[2] == (
        "slurm-allocation", "fail", "worker2", "worker2 is not a node of Slurm job 2 (its nodes: master,worker1)",
        "leave worker2 out (ddp-preflight --slurm-job 2 master worker1), or run inside an allocation that "
        "includes it: salloc -N 3 -w master,worker1,worker2")


def test_time_left_warns_under_the_threshold_with_the_numbers_and_passes_saying_how_long():
    assert results("gres2_c2_t5")[-1] == (
        "slurm-time-left", "warn", None,
        "Slurm job 3 ends in 5 min 0 s (at 2026-11-25T06:56:50, 00:05:00 limit): under 10 min, "
        "Slurm will stop the training then",
        "salloc -N 2 --time HH:MM:SS   # a new allocation as long as the training needs (sbatch --time the same); "
        "only an admin can extend job 3")
    assert results("gres2_c2_t5", min_time_left=240.0)[-1] == (
        "slurm-time-left", "pass", None, "5 min 0 s left of Slurm job 3's 00:05:00 (ends 2026-11-25T06:56:50)", None)
    assert results("gpn1_t30")[-1] == (
        "slurm-time-left", "pass", None, "30 min left of Slurm job 4's 00:30:00 (ends 2026-11-25T07:21:50)", None)
    assert results("ntpn2_t60", min_time_left=3601.0)[-1][:2] == ("slurm-time-left", "warn")


def test_a_node_drained_under_the_job_is_a_warning_the_job_runs_on():
    # The state scontrol shows for a node drained while a job holds it (the lab test drains it for
    # real): Slurm runs the job's steps there, and places no new job on it.
    from ddp_preflight.transport.slurm import SlurmNodeInfo
    draining = dataclasses.replace(job("plain"), info={"worker1": SlurmNodeInfo("worker1", "10.213.5.11", "MIXED+DRAIN",
                                                                                "disk errors")})
    ctx = dataclasses.replace(context(clean(), nproc_per_node=1), slurm=draining)
    said = [(r.status.value, r.node, r.summary, r.fix) for r in run_checks(ctx, (BY_ID["slurm-allocation"],))]
    assert said == [
        ("pass", "master", "1 CPU of Slurm job 2 for 1 rank; 1 task per node", None),
        ("warn", "worker1", "Slurm is draining worker1 (reason: disk errors): this job's steps still run there to its "
                            "end, but no new job will be placed on it",
         "nothing for this run; for the next, an admin resumes worker1 once its cause is fixed: "
         "scontrol update nodename=worker1 state=resume")]


def test_a_hostfiles_own_slots_are_judged_against_each_nodes_share():
    # Issue 39: the recorded -n 3 job holds 2 CPUs on master and 1 on worker1; a hostfile giving
    # master 2 ranks and worker1 1 fits it on both, where 2 ranks a node would not fit worker1.
    own = [r for r in results("hetero_n3", nproc_per_node=2, nprocs={"master": 2, "worker1": 1})
           if r[0] == "slurm-allocation"]
    assert [(node, status) for _, status, node, _, _ in own] == [("master", "pass"), ("worker1", "pass")], own
    even = [r for r in results("hetero_n3", nproc_per_node=2) if r[0] == "slurm-allocation"]
    assert [(node, status) for _, status, node, _, _ in even] == [("master", "pass"), ("worker1", "warn")], even
