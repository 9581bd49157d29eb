"""The compute probe: a short matmul benchmark on every node, with the thread count training
will get there (for a CUDA run: on each GPU the node's ranks will use), so compute-balance can
name the node (and the GPU) every synchronous step waits for.

With the collectives or bandwidth probe, the benchmark runs in their torch job (together.py), on
every node at the same moment, once every rank has imported torch: one torch start instead of
one per node. On its own the nodes take turns: nodes that share a machine's cores (the lab's, or
VMs on one host) would otherwise be slowed by each other's start-up. The next node starts as
soon as the previous one has printed its figure, so its start-up overlaps the previous one's exit.
A node that looks like a straggler is measured once more, longer, alone, before it is named, and
keeps its better figure: a moment of someone else's load is not a slow node."""

from __future__ import annotations

import threading

from ddp_preflight.node import protocol
from ddp_preflight.rules.environment import env_of

from ..checks.bandwidth import STRAGGLER_RATIO
from ..model import NodeFacts, Options
from . import torchjob
from .bandwidth_seen import NodeFigures
from .gpus import cuda_blocked
from .together import Part, Together, serial

TIMEOUT = 30.0       # seconds per node; the benchmark itself takes under one
FIRST_SECONDS = 0.5  # of timed products per node: outside load comes in dips of a fraction of a second
SECOND_SECONDS = 1.0  # a second, longer look at a suspected straggler: more chances to see it unhindered
TURN_OVER = (protocol.COMPUTE, protocol.JOB)


def threads_for(node: NodeFacts, options: Options) -> tuple[int | None, str]:
    """The threads one rank computes with, and why: None means torch's own default."""
    raw = (env_of(node).get("OMP_NUM_THREADS") or "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw), f"OMP_NUM_THREADS={raw}"
    if options.nproc_on(node.node) > 1:
        # torchrun sets OMP_NUM_THREADS=1 for every rank when it starts several per node.
        return 1, f"torchrun's default for {options.nproc_on(node.node)} processes per node"
    return None, "torch's default"


def benchmark_spec(node: NodeFacts, options: Options, seconds: float) -> tuple[dict, str | None]:
    """The benchmark's spec on one node, and where its thread count comes from (CPU only)."""
    if options.device == "cuda":
        # The GPUs the node's ranks will use: rank i computes on cuda:i.
        return {"program": "compute", "seconds": seconds, "device": "cuda",
                "gpus": max(1, options.nproc_on(node.node))}, None
    threads, source = threads_for(node, options)
    return {"program": "compute", "seconds": seconds, "threads": threads}, source


def _in_turns(cluster, nodes, options, indexes: list[int], seconds: float) -> dict[int, dict]:
    """Each node's benchmark, one after another; {index: figures or {"error": why}}."""
    jobs, out = [], {}
    for i in indexes:
        spec, source = benchmark_spec(nodes[i], options, seconds)
        turn_over = threading.Event()     # its figure is out, or the job ended without one
        # The training's own variables for this node (--env, the config's [env]): the benchmark
        # computes as the ranks will (its thread count is set from them, threads_for).
        job = cluster.job(i, spec, env=options.env.for_node(nodes[i].node), timeout=TIMEOUT,
                          on_line=lambda line, e=turn_over: e.set() if line.startswith(TURN_OVER) else None)
        jobs.append((i, source, job))
        turn_over.wait(TIMEOUT + 5)
    for i, source, job in jobs:
        out[i] = _figures(job.wait(TIMEOUT + 30), source)
    return out


def _figures(result, source: str | None) -> dict:
    """One node's figures from its job, or {"error": why}."""
    lines = result.json_lines(protocol.COMPUTE)
    if lines and "error" not in lines[-1]:
        return {**lines[-1], **({"threads_from": source} if source else {})}
    return {"error": lines[-1]["error"] if lines else torchjob.job_error(result)}


def _all_at_once(together: Together | None, nodes, options, indexes: list[int]) -> dict[int, dict] | None:
    """Each node's benchmark in the shared torch job (together.py), every node at once; None
    where that job does not carry it."""
    if together is None:
        return None
    specs = [benchmark_spec(nodes[i], options, FIRST_SECONDS) for i in indexes]
    results = together.run("compute", Part(tuple(indexes), (1,) * len(indexes), timeout=TIMEOUT,
                                           specs=tuple(s for s, _ in specs)))
    if results is None:
        return None
    return {i: _figures(result, source) for i, (_, source), result in zip(indexes, specs, results, strict=True)}


def probe(cluster, nodes: tuple[NodeFacts, ...], options: Options, together: Together | None = None) -> dict:
    """`together`: the first benchmark runs in the shared job of the probes that need torch."""
    usable = [i for i in cluster.usable() if nodes[i].error is None]
    if not usable:
        return {"skipped": "no node was reached"}
    blocked = cuda_blocked(nodes, options, usable)
    if blocked:
        return {"skipped": blocked}
    figures = _all_at_once(together, nodes, options, usable)
    if figures is None:
        with serial(together):
            figures = _in_turns(cluster, nodes, options, usable, FIRST_SECONDS)
    for _ in range(2):     # a second look can make another node the slow one: look at it too
        measured = {i: f for i, f in figures.items() if "gflops" in f}
        top = max((NodeFigures.from_json(f).fastest for f in measured.values()), default=0.0)
        slow = [i for i, f in measured.items()
                if NodeFigures.from_json(f).fastest < STRAGGLER_RATIO * top and "first_gflops" not in f]
        if not slow:
            break
        with serial(together):
            seconds = _in_turns(cluster, nodes, options, slow, SECOND_SECONDS)
        for i, again in seconds.items():
            first = figures[i]["gflops"]
            if "gflops" in again and NodeFigures.from_json(again).fastest > NodeFigures.from_json(figures[i]).fastest:
                figures[i] = again
            figures[i]["first_gflops"] = first
    return {"nodes": {nodes[i].node: f for i, f in figures.items() if "error" not in f},
            "errors": {nodes[i].node: f["error"] for i, f in figures.items() if "error" in f}}
