"""Preflight as a library call: `run(targets, options) -> Report`, as the CLI and the launcher use
it. Facts from every node, then the probes the selected checks need, then the checks; one
unreachable node is that node's result, never the end of the report.

    from ddp_preflight.preflight.api import run
    from ddp_preflight.preflight.cluster import Target
    from ddp_preflight.preflight.model import Options
    report = run([Target("master", "/opt/venv/bin/python"), Target("worker1", "/opt/venv/bin/python")],
                 Options(nproc_per_node=2))

`check(cluster, options, checks)` does the same on connections the caller keeps open: the
launcher starts the training on the connections preflight opened."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace

from ddp_preflight.transport.node import Progress

from . import nproc_auto
from .checks import CHECKS, run_checks
from .cluster import Cluster, Target, gather
from .model import Check, Context, NodeFacts, Options, Report
from .probes.run import run_probes


@dataclass(frozen=True)
class Preflight:
    """A finished preflight: the report, every node's facts, and the options as they were
    settled (the master address the workers dial, found on the way)."""
    report: Report
    nodes: tuple[NodeFacts, ...]
    options: Options
    # Preflight's own wall time per stage, in order: ("facts", s), ("probes", s) and within it
    # ("probe collectives", s), ... (the probes that need torch overlap: one shared job), then
    # ("checks", s), ("total", s). What `-v` prints; the report is the same without it.
    stages: tuple[tuple[str, float], ...] = ()


def check(cluster: Cluster, options: Options, checks: Iterable[Check] = CHECKS,
          on_progress: Progress | None = None, in_ranks=None) -> Preflight:
    """`in_ranks` (under --launch, launch/in_ranks.py): the probes that need torch run inside the
    training's own ranks, which then wait for the launcher's word (probes/together.py)."""
    checks = tuple(checks)
    request = {"master_port": options.master_port, "master_addr": options.master_addr,
               "launch_args": list(options.launch_args), "nnodes": len(cluster.targets),
               "nproc_per_node": options.nproc_per_node,
               # Where the training starts on each node (node/placement.py, as launch/plan.py
               # places it): the collector resolves the training command's imports from there.
               "launch_cwd": os.getcwd(),
               "master_code_dir": cluster.targets[0].code_dir if cluster.targets else None}
    env = {t.name: options.env.for_node(t.name) for t in cluster.targets}
    began = started = time.monotonic()
    found, master_addr = gather(cluster, request, on_progress=on_progress, env=env)
    stages = [("facts", time.monotonic() - started)]
    nodes = tuple(found)
    options = replace(options, master_addr=master_addr)
    if options.nproc_auto:       # as torchrun's auto, from what the nodes have (raises NprocError)
        options = replace(options, nproc_per_node=nproc_auto.settle(nodes, options.device), nproc_auto=False)
    needed = sorted({p for c in checks for p in c.needs})
    seconds: dict[str, float] = {}
    started = time.monotonic()
    probes = run_probes(needed, cluster, nodes, options, seconds, in_ranks) if needed else {}
    if needed:
        stages += [("probes", time.monotonic() - started), *((f"probe {name}", s) for name, s in seconds.items())]
        if in_ranks is not None and in_ranks.seconds is not None:
            stages.append(("probes in the training's ranks, until every rank waited", in_ranks.seconds))
    started = time.monotonic()
    ctx = Context(nodes, options, probes, cluster.slurm_job)
    report = Report(tuple(run_checks(ctx, checks)), tuple(n.node for n in nodes))
    stages += [("checks", time.monotonic() - started), ("total", time.monotonic() - began)]
    return Preflight(report, nodes, options, tuple(stages))


def run(targets: list[Target], options: Options | None = None, *, checks: Iterable[Check] = CHECKS,
        ssh_config: str | None = None, on_progress: Progress | None = None) -> Report:
    with Cluster(targets, ssh_config) as cluster:
        return check(cluster, options or Options(), checks, on_progress).report
