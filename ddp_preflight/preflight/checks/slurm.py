"""slurm-allocation and slurm-time-left: what Slurm gave the job preflight runs in, against the
run it plans. They read Slurm's own view (`scontrol show job -d`, transport/slurm.py), so they
speak only when preflight reaches its nodes through a Slurm job (--slurm-job ID, or --slurm
inside salloc or sbatch)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from ddp_preflight.rules.fix import change, run

from ..model import Context, Status, Verdict

if TYPE_CHECKING:
    from ddp_preflight.transport.slurm import SlurmJob

NOT_IN_A_JOB = "not run through a Slurm job (--slurm-job ID, or --slurm inside salloc or sbatch)"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _tasks_per_node(job: SlurmJob) -> int | None:
    """Tasks Slurm plans on each node: --ntasks-per-node, else NumTasks when it spreads evenly."""
    if job.tasks_per_node:
        return job.tasks_per_node
    if job.nodes and job.num_tasks and job.num_tasks % len(job.nodes) == 0:
        return job.num_tasks // len(job.nodes)
    return None


def check_slurm_allocation(ctx: Context) -> Iterator[Verdict]:
    job = ctx.slurm
    if job is None:
        yield Verdict(Status.SKIP, None, NOT_IN_A_JOB)
        return
    gpu_run = ctx.options.device == "cuda" or ctx.options.backend == "nccl"
    tasks = _tasks_per_node(job)
    hosts = [n.node for n in ctx.nodes]
    for node in ctx.nodes:
        name = node.node
        ranks = max(1, ctx.options.nproc_on(name))      # its own where a hostfile gives each host its slots
        share = job.shares.get(name)
        details = {"job": job.job_id, "nproc_per_node": ranks, "tasks_per_node": tasks,
                   "cpus_per_task": job.cpus_per_task, "cpus": share.cpus if share else None,
                   "gpus": share.gpus if share else None, "gres": share.gres if share else None,
                   "tres_per_node": job.tres_per_node, "gpu_run": gpu_run}
        if name not in job.nodes:
            inside = [h for h in hosts if h in job.nodes]
            yield Verdict(Status.FAIL, name,
                          f"{name} is not a node of Slurm job {job.job_id} (its nodes: {','.join(job.nodes)})",
                          change(f"leave {name} out (ddp-preflight --slurm-job {job.job_id} {' '.join(inside)}), "
                                 f"or run inside an allocation that includes it: salloc -N {len(hosts)} "
                                 f"-w {','.join(hosts)}"), details)
            continue
        if share is None:
            yield Verdict(Status.SKIP, node.node,
                          f"scontrol show job -d {job.job_id} lists no CPUs of the job on {name}", None, details)
            continue
        status, said, flags, fewer = Status.PASS, [], [], []
        info = job.info.get(name)
        if info is not None and info.draining:
            # Slurm's own state, respected: the job's steps run there to its end (srun does), so
            # this is no failure; but the node leaves the pool, and the next allocation lacks it.
            status = Status.WARN
            reason = f" (reason: {info.reason})" if info.reason and info.reason != "(null)" else ""
            said.append(f"Slurm is draining {name}{reason}: this job's steps still run there to its end, "
                        "but no new job will be placed on it")
            details["state"] = info.state
        if gpu_run and share.gpus < ranks:
            status = Status.FAIL
            asked = "" if share.gpus or job.tres_per_node else " (it asked for none: no --gpus-per-node or --gres)"
            said.append(f"{_plural(share.gpus, 'GPU')} of Slurm job {job.job_id} on {name} for {ranks} ranks "
                        f"of a GPU run{asked}")
            flags.append(f"--gpus-per-node {ranks}")
            if share.gpus:
                fewer.append(share.gpus)
        if share.cpus < ranks:
            status = max(status, Status.WARN, key=lambda s: s.severity)
            said.append(f"{_plural(share.cpus, 'CPU')} of Slurm job {job.job_id} on {name} for {ranks} ranks: "
                        f"the ranks take turns on {'it' if share.cpus == 1 else 'them'}")
            flags.append(f"--ntasks-per-node 1 --cpus-per-task {ranks}")
            fewer.append(share.cpus)
        if tasks is not None and tasks not in (1, ranks):
            status = max(status, Status.WARN, key=lambda s: s.severity)
            said.append(f"Slurm plans {tasks} tasks per node and preflight {ranks} ranks per node: neither one "
                        f"torchrun per node (1 task) nor one task per rank ({ranks})")
            if not any(f.startswith("--ntasks-per-node") for f in flags):
                flags.append("--ntasks-per-node 1")
        if status is Status.PASS:
            gpus = f" and {_plural(share.gpus, 'GPU')}" if gpu_run or share.gpus else ""
            layout = f"; {_plural(tasks, 'task')} per node" if tasks is not None else ""
            yield Verdict(Status.PASS, name, f"{_plural(share.cpus, 'CPU')}{gpus} of Slurm job {job.job_id} "
                          f"for {_plural(ranks, 'rank')}{layout}", None, details)
            continue
        fix = run(f"salloc -N {len(job.nodes)} {' '.join(flags)}",
                  note="or sbatch with the same options"
                  + (f"; or fewer ranks: --nproc-per-node {min(fewer)}" if fewer else "")) if flags else \
            change(f"nothing for this run; for the next, an admin resumes {name} once its cause is fixed: "
                   f"scontrol update nodename={name} state=resume")
        yield Verdict(status, name, "; ".join(said), fix, details)


def duration(seconds: float) -> str:
    """3 min 20 s, 45 min, 2 h 5 min, 1 d 4 h: as precise as a person would say it."""
    s = max(0, int(seconds))
    if s < 600:
        return f"{s // 60} min {s % 60} s" if s >= 60 else f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def check_slurm_time_left(ctx: Context) -> Iterator[Verdict]:
    job = ctx.slurm
    if job is None:
        yield Verdict(Status.SKIP, None, NOT_IN_A_JOB)
        return
    left = job.seconds_left
    wanted = ctx.options.min_time_left
    details = {"job": job.job_id, "time_limit": job.time_limit, "end_time": job.end_time,
               "seconds_left": None if left is None else int(left), "min_time_left": wanted}
    if left is None:
        yield Verdict(Status.PASS, None, f"Slurm job {job.job_id} has no time limit (TimeLimit={job.time_limit})",
                      None, details)
    elif left < wanted:
        yield Verdict(Status.WARN, None,
                      f"Slurm job {job.job_id} ends in {duration(left)} (at {job.end_time}, {job.time_limit} "
                      f"limit): under {duration(wanted)}, Slurm will stop the training then",
                      run(f"salloc -N {len(job.nodes)} --time HH:MM:SS",
                          note="a new allocation as long as the training needs (sbatch --time the same); "
                               f"only an admin can extend job {job.job_id}"), details)
    else:
        yield Verdict(Status.PASS, None, f"{duration(left)} left of Slurm job {job.job_id}'s {job.time_limit} "
                      f"(ends {job.end_time})", None, details)
