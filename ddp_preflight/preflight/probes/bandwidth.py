"""The bandwidth probe: all_reduce latency and bus bandwidth between the nodes, measured by a
torchrun job over the real backend, one rank per node (the link between nodes is what is
measured, not the processes within one), on the run's master port."""

from __future__ import annotations

from ddp_preflight.node import protocol
from ddp_preflight.rules.facts import Missing

from ..checks.path_mtu import lost_words
from ..model import NodeFacts, Options
from . import torchjob
from .gpus import Plan, collective_plan, cuda_blocked
from .job_end import ended_by_us_or_outside, load_per_cpu, load_words
from .network_seen import NetworkSeen, not_run_over
from .path_mtu_seen import PathMtuSeen
from .together import Part, Together, serial

TIMEOUT = 60.0       # seconds for the whole job; the job itself aims at a few


def master_port_held(nodes: tuple[NodeFacts, ...]) -> bool:
    """Whether something already listens on the master port on the master (see master-port)."""
    held = nodes[0].parsed.master_port
    return not isinstance(held, Missing) and held.listening


def plan(nodes: tuple[NodeFacts, ...], options: Options, usable: list[int]) -> Plan:
    """One rank per node: the link between the nodes is what is measured. A single GPU node
    has no such link; one rank per GPU there measures the link between its GPUs instead."""
    if 0 not in usable:
        return Plan(skipped="needs the master and at least one more reachable node")
    blocked = cuda_blocked(nodes, options, usable)
    if blocked:
        return Plan(skipped=blocked)
    if len(usable) >= 2:
        return Plan((1,) * len(usable))
    if options.device != "cuda":
        return Plan(skipped="needs the master and at least one more reachable node")
    return collective_plan(nodes, options, usable)


def probe(cluster, nodes: tuple[NodeFacts, ...], options: Options, seen: dict | None = None,
          network: dict | None = None, together: Together | None = None) -> dict:
    """`seen`: the path-MTU probe's data, `network`: the network probe's, when they ran first.
    `together`: its job is the shared one of the probes that need torch (together.py)."""
    usable = [i for i in cluster.usable() if nodes[i].error is None]
    ranks = plan(nodes, options, usable)
    if ranks.skipped:
        return {"skipped": ranks.skipped}
    if master_port_held(nodes):
        return {"skipped": f"the master port {options.master_port} is held on {nodes[0].node} (see master-port)"}
    names = {nodes[i].node for i in usable}
    lost = [d for d in PathMtuSeen.from_json(seen or {}).blackholes() if d.src in names and d.dst in names]
    if lost:
        # Its large all_reduce would hang until the job's bound: say what hangs it instead.
        return {"skipped": f"{lost_words(lost[0])}; a large all_reduce would hang there (see path-mtu)",
                "path_mtu": [d.to_json() for d in lost]}
    # The job pins preflight's interface: the paths into each node's pinned address (its own, when
    # its ranks connect to each other: more than one per node).
    seen_net = NetworkSeen.from_json(network or {})
    blocked = seen_net.blocking(seen_net.pinned_binds(names), _on(nodes, usable, ranks.counts))
    if blocked:
        # Its ranks could not connect there: the job would wait out its bound. Say what blocks it.
        return {"skipped": not_run_over(blocked[0]), "blocked": [b.to_json() for b in blocked]}
    job = torchjob.TorchJob(job="bandwidth", args=("--backend", options.backend, "--device", options.device),
                            counts=ranks.counts, timeout=TIMEOUT)
    results = together.run("bandwidth", Part(tuple(usable), job.counts, job.args, job.timeout)) \
        if together is not None else None
    if results is None:
        with serial(together):
            results = torchjob.run(cluster, nodes, options, job, usable)
    stranger = torchjob.interfered(results, options.master_port)
    if stranger:
        return {"error": stranger}
    lines = torchjob.marked(results, protocol.BANDWIDTH)
    if not lines:
        # The node whose job failed by itself first; one we (or its bound, or a signal) ended is
        # how the probe ended, not what failed in it.
        failed = next((r for r in results if not r.ok and not ended_by_us_or_outside(r)), None) or \
            next((r for r in results if not r.ok), results[0])
        node = next(n for n in nodes if n.node == failed.node)
        unfinished = ended_by_us_or_outside(failed) and not failed.timed_out
        return {"failed": {"node": failed.node, "timed_out": failed.timed_out, "unfinished": unfinished,
                           "error": torchjob.job_error(failed) + (load_words(node) if unfinished else ""),
                           "load_per_cpu": load_per_cpu(node)}}
    return {"nodes": [nodes[i].node for i in usable], "job_seconds": max(r.seconds for r in results), **lines[-1]}


def _on(nodes: tuple[NodeFacts, ...], usable: list[int], counts: tuple[int, ...]) -> dict[str, int]:
    """Each node's name -> the ranks the job starts there."""
    return {nodes[i].node: n for i, n in zip(usable, counts, strict=True)}
