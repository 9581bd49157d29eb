"""Whether a probe's job can work on the GPUs of a CUDA run, decided from the facts before any
job starts. A job that cannot work is not started: its ranks would fail with a CUDA error that
says nothing of the cause (issue 13: 'invalid device ordinal' on a one-GPU host, then a firewall
fix). The probe skips instead, naming the check that shows the cause, and that check's result
carries the fix."""

from __future__ import annotations

from dataclasses import dataclass

from ddp_preflight.rules.facts import Missing

from ..checks.gpu import check_gpu_visible, nccl_device, sight
from ..checks.hardware import check_device_dtype
from ..model import Context, NodeFacts, Options, Status


@dataclass(frozen=True)
class Plan:
    """How many ranks a probe's job starts on each node (in the order of the nodes it runs on), or
    why it does not start."""
    counts: tuple[int, ...] = ()
    skipped: str | None = None      # the reason, for "not probed: ..."

    @property
    def world(self) -> int:
        return sum(self.counts)


def has_cuda(node: NodeFacts) -> bool:
    torch = node.parsed.torch
    return not isinstance(torch, Missing) and torch.cuda_available and bool(torch.cuda_devices)


def cuda_blocked(nodes: tuple[NodeFacts, ...], options: Options, usable: list[int]) -> str | None:
    """Why no job can run on the GPUs of these nodes (device-dtype or gpu-visible fails there);
    None when one can, or for a CPU run."""
    if options.device != "cuda":
        return None
    if not any(has_cuda(nodes[i]) for i in usable):
        return "no node has a CUDA device (see device-dtype)"
    ctx = Context(nodes, options)
    names = {nodes[i].node for i in usable}
    device = [v for v in check_device_dtype(ctx) if v.status is Status.FAIL and v.node in names]
    if device:
        return "; ".join(v.summary for v in device) + " (see device-dtype)"
    short = [v for v in check_gpu_visible(ctx) if v.status is Status.FAIL and v.node in names]
    if short:
        seen = ", ".join(f"{v.node} sees {_gpus(v.details['gpus_seen'])}" for v in short)
        return (f"{options.nproc_per_node} rank{'s' if options.nproc_per_node > 1 else ''} per node but {seen}: "
                "the ranks past the GPUs would fail (see gpu-visible)")
    return None


def _gpus(count: int) -> str:
    return "no GPU" if not count else f"{count} GPU{'s' if count > 1 else ''}"


def collective_plan(nodes: tuple[NodeFacts, ...], options: Options, usable: list[int]) -> Plan:
    """Ranks per node for a job whose ranks talk to each other (collectives; bandwidth on one
    node). On GPUs one rank per GPU, as training runs: NCCL refuses two ranks on one GPU."""
    blocked = cuda_blocked(nodes, options, usable)
    if blocked:
        return Plan(skipped=blocked)
    # Each node runs as many as training will start there (a hostfile may give each host its own).
    counts = tuple(options.nproc_on(nodes[i].node) for i in usable)
    if sum(counts) >= 2:
        return Plan(counts)
    if options.device != "cuda":
        return Plan((2,))      # one CPU node: two ranks still show what the backend implements
    node = nodes[usable[0]]
    seen = sight(node)
    if (seen.count or 0) >= 2:
        return Plan((2,))      # one node, two of its GPUs: what the backend does between them
    reason = f"one GPU in the run ({node.node}'s): nothing to exchange within it"
    if options.backend == "nccl":
        device = nccl_device(seen.devices[0].pci_bus_id) if seen.devices else "…"
        reason += (f", and NCCL cannot put two ranks on one GPU ('Duplicate GPU detected : rank 1 and rank 0 "
                   f"both on CUDA device {device}')")
    return Plan(skipped=reason + "; give a second node")
