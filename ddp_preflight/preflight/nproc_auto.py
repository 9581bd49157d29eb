"""--nproc-per-node auto, settled from the nodes' facts as torchrun settles it on each node: its
GPUs on a CUDA run (those the training Python sees, CUDA_VISIBLE_DEVICES applied), its CPUs
(os.cpu_count()) on a CPU run. ddp-preflight starts as many ranks on every node, so the nodes
must agree; where they do not, or a node cannot say, it is one line naming them and the fix."""

from __future__ import annotations

from collections.abc import Sequence

from ddp_preflight.rules.facts import Missing

from .checks.gpu import sight
from .model import NodeFacts


class NprocError(Exception):
    """auto cannot be settled: one line, the CLI's exit 2."""


def settle(nodes: Sequence[NodeFacts], device: str) -> int:
    counts: dict[str, int | None] = {}
    for node in nodes:
        if node.error is not None:
            continue
        if device == "cuda":
            counts[node.node] = sight(node).count
        else:
            cpu = node.parsed.cpu
            counts[node.node] = None if isinstance(cpu, Missing) else cpu.logical_cores
    what = "GPUs" if device == "cuda" else "CPUs"
    unknown = [name for name, n in counts.items() if not n]
    if unknown:
        raise NprocError(f"--nproc-per-node auto: {', '.join(unknown)} {'shows' if len(unknown) == 1 else 'show'} "
                         f"no {what} to count: give --nproc-per-node N")
    if not counts:
        return 1            # no node reached: node-reachable says why
    if len(set(counts.values())) > 1:
        said = ", ".join(f"{name} {n}" for name, n in counts.items())
        raise NprocError(f"--nproc-per-node auto: the nodes have different numbers of {what} ({said}) and "
                         f"ddp-preflight starts as many ranks on each: give --nproc-per-node N "
                         f"(at most {min(n for n in counts.values() if n)})")
    return next(n for n in counts.values() if n)
