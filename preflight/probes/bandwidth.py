"""The bandwidth probe: all_reduce latency and bus bandwidth between the nodes, measured by a
torchrun job over the real backend, one rank per node (the link between nodes is what is
measured, not the processes within one), on the run's master port."""

from __future__ import annotations

from node import protocol

from ..facts import Missing
from ..model import NodeFacts, Options
from . import torchjob

TIMEOUT = 60.0       # seconds for the whole job; the job itself aims at a few


def master_port_held(nodes: tuple[NodeFacts, ...]) -> bool:
    """Whether something already listens on the master port on the master (see master-port)."""
    held = nodes[0].parsed.master_port
    return not isinstance(held, Missing) and held.listening


def probe(cluster, nodes: tuple[NodeFacts, ...], options: Options) -> dict:
    usable = [i for i in cluster.usable() if nodes[i].error is None]
    if len(usable) < 2 or 0 not in usable:
        return {"skipped": "needs the master and at least one more reachable node"}
    if master_port_held(nodes):
        return {"skipped": f"the master port {options.master_port} is held on {nodes[0].node} (see master-port)"}
    job = torchjob.TorchJob(job="bandwidth", args=("--backend", options.backend, "--device", options.device),
                            timeout=TIMEOUT)
    results = torchjob.run(cluster, nodes, options, job, usable)
    lines = torchjob.marked(results, protocol.BANDWIDTH)
    if not lines:
        failed = next((r for r in results if not r.ok), results[0])
        reason = failed.error or ("timed out" if failed.timed_out else torchjob.tail(failed))
        return {"error": f"the all_reduce job failed on {failed.node}: {reason}"}
    return {"nodes": [nodes[i].node for i in usable], "job_seconds": max(r.seconds for r in results), **lines[-1]}
