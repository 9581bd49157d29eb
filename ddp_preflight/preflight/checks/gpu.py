"""gpu-visible, gpu-memory-held, gpu-health: the GPUs each node's ranks will see, whether
something else holds their memory, and whether they are healthy and at full speed.

All three judge the `gpu` facts (node/facts/gpu.py) of a --device cuda run; CPU runs skip them."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ddp_preflight.rules.environment import env_fix, env_of
from ddp_preflight.rules.facts import OLDER_COLLECTOR, CudaDevice, DriverView, GpuDevice, GpuFacts, GpuLink, GpuProcess, Missing
from ddp_preflight.rules.fix import Fix, change, run

from ..model import Context, NodeFacts, Status, Verdict
from .common import describe_process

MIB = 2**20
# GPU memory in use with no process to show for it, above which someone else's work is assumed:
# an idle GPU shows 0 MiB used (the driver's own share is "reserved"), older drivers a few hundred.
UNSEEN_USE_BYTES = 2**30


def cpu_run(ctx: Context) -> Verdict | None:
    """The one verdict a GPU check gives for a CPU run."""
    if ctx.options.device == "cuda":
        return None
    return Verdict(Status.SKIP, None, f"not a GPU run (--device {ctx.options.device})")


def driver_of(node: NodeFacts) -> DriverView | Missing:
    """What the node's NVIDIA driver said; Missing: no driver answered, the gpu section failed
    (both say why), or it was not collected."""
    gpu = node.parsed.gpu
    if isinstance(gpu, Missing):
        return gpu if gpu.failed else OLDER_COLLECTOR
    return gpu.driver


def visible_var(node: NodeFacts, name: str) -> str | None:
    gpu = node.parsed.gpu
    if isinstance(gpu, GpuFacts) and not isinstance(gpu.visible, Missing):
        return gpu.visible.get(name)
    return env_of(node).get(name)   # older collectors: env only


def apply_cuda_visible(value: str | None, devices: list[GpuDevice]) -> list[GpuDevice]:
    """The devices CUDA shows for CUDA_VISIBLE_DEVICES=value, in its order. Unset: all; empty:
    none; else a comma list of indexes, GPU-UUID prefixes or MIG instances, read up to the first
    entry CUDA cannot use ("none", "-1", an index out of range, a repeat), which hides it and
    every entry after it."""
    if value is None:
        return list(devices)
    chosen: list[GpuDevice] = []
    for token in (t.strip() for t in value.split(",")):
        match: GpuDevice | None
        if token.isdigit():
            match = next((d for d in devices if d.index == int(token)), None)
        elif token.startswith("GPU-"):
            matches = [d for d in devices if (d.uuid or "").startswith(token)]
            match = matches[0] if len(matches) == 1 else None
        elif token.startswith("MIG-"):
            match = GpuDevice.from_json({"index": None, "name": f"MIG instance {token}", "mig": True})
        else:
            match = None
        if match is None or match in chosen:
            break
        chosen.append(match)
    return chosen


@dataclass(frozen=True)
class Sight:
    """What one node's ranks will see."""
    count: int | None            # GPUs a rank can pick from; None: not known
    devices: list[GpuDevice]     # the driver's facts of those GPUs (empty when it was not asked)
    physical: int | None         # GPUs the driver lists, before CUDA_VISIBLE_DEVICES
    source: str                  # where the count comes from


def sight(node: NodeFacts) -> Sight:
    driver, torch = driver_of(node), node.parsed.torch
    physical = None if isinstance(driver, Missing) else list(driver.devices)
    chosen = apply_cuda_visible(visible_var(node, "CUDA_VISIBLE_DEVICES"), physical) if physical is not None else []
    if not isinstance(torch, Missing) and torch.build == "cuda" and torch.imported and torch.cuda_available:
        # The training Python itself, with the same environment the ranks inherit.
        return Sight(len(torch.cuda_devices), chosen, len(physical) if physical is not None else None, "torch")
    if not isinstance(driver, Missing) and physical is not None:
        return Sight(len(chosen), chosen, len(physical), driver.source)
    return Sight(None, [], None, "none")


def nccl_device(bus_id: str | None) -> str:
    """The number NCCL prints for a GPU ("CUDA device 60"): its PCI bus id read as hex."""
    digits = re.sub(r"[^0-9a-fA-F]", "", bus_id or "")
    return format(int(digits, 16), "x") if digits else "…"


def _names(devices: Sequence[GpuDevice | CudaDevice]) -> str:
    names = [d.name or "?" for d in devices]
    if len(set(names)) == 1:
        return names[0] if len(names) == 1 else f"{len(names)} x {names[0]}"
    return ", ".join(names)


def topology(devices: list[GpuDevice], links: Sequence[GpuLink]) -> str:
    """One line: how the GPUs connect (NVLink or the PCIe path, as `nvidia-smi topo -m` names
    it), their PCIe links, and their NUMA nodes."""
    indexes = {d.index for d in devices}
    parts = []
    pairs = [link for link in links if set(link.gpus) <= indexes]
    if pairs:
        nvlink = sum(1 for link in pairs if link.nvlink)
        paths: dict[str, int] = {}
        for link in pairs:
            if not link.nvlink:
                paths[link.path or "?"] = paths.get(link.path or "?", 0) + 1
        if nvlink == len(pairs):
            parts.append(f"NVLink between all {len(pairs)} pair{'s' if len(pairs) > 1 else ''}")
        else:
            parts.append(", ".join(([f"NVLink: {nvlink} pairs"] if nvlink else [])
                                   + [f"PCIe {path}: {n} pair{'s' if n > 1 else ''}" for path, n in sorted(paths.items())]))
    widths = {(d.pcie_gen, d.pcie_width) for d in devices if d.pcie_width}
    if len(widths) == 1:
        gen, width = widths.pop()
        parts.append(f"PCIe gen{gen} x{width}")
    numa: dict[int, list[str]] = {}
    for d in devices:
        if d.numa_node is not None:
            numa.setdefault(d.numa_node, []).append(str(d.index))
    if numa:
        parts.append("; ".join(f"NUMA {n}: GPU {','.join(gpus)}" if len(numa) > 1 else f"NUMA {n}"
                               for n, gpus in sorted(numa.items())))
    return ", ".join(parts)


def check_gpu_visible(ctx: Context) -> Iterator[Verdict]:
    skip = cpu_run(ctx)
    if skip:
        yield skip
        return
    sights = {node.node: sight(node) for node in ctx.reachable}
    known = [s.count for s in sights.values() if s.count]
    for position, node in enumerate(ctx.nodes):
        if node.error is not None:
            continue
        ranks = max(1, ctx.options.nproc_on(node.node))      # its own where a hostfile gives each host its slots
        seen = sights[node.node]
        torch, driver = node.parsed.torch, driver_of(node)
        cuda_visible = visible_var(node, "CUDA_VISIBLE_DEVICES")
        links = () if isinstance(driver, Missing) else driver.links
        details = {"nproc_per_node": ranks, "gpus_seen": seen.count, "gpus_in_box": seen.physical,
                   "from": seen.source, "CUDA_VISIBLE_DEVICES": cuda_visible,
                   "NVIDIA_VISIBLE_DEVICES": visible_var(node, "NVIDIA_VISIBLE_DEVICES"),
                   "gpus": [d.to_json() for d in seen.devices], "links": [link.to_json() for link in links]}
        if not isinstance(torch, Missing) and torch.build == "cuda" and torch.imported and not torch.cuda_available:
            yield Verdict(Status.SKIP, node.node,
                          f"torch cannot use CUDA on {node.node}: see device-dtype and nccl-parity", None, details)
            continue
        if seen.count is None:
            # The driver's own reason, else torch's: a failed gpu section says its error too.
            why = driver.reason if isinstance(driver, Missing) and driver.failed else \
                torch.reason if isinstance(torch, Missing) else "no CUDA build of torch to ask"
            yield Verdict(Status.SKIP, node.node, f"not known how many GPUs {node.node} has: {why}", None, details)
            continue
        if seen.count >= ranks:
            idle = f"; {seen.count - ranks} left idle" if seen.count > ranks else ""
            line = topology(seen.devices, links)
            named: Sequence[GpuDevice | CudaDevice] = seen.devices or \
                (() if isinstance(torch, Missing) else torch.cuda_devices)
            yield Verdict(Status.PASS, node.node,
                          f"{ranks} rank{'s' if ranks > 1 else ''} on {seen.count} GPU{'s' if seen.count > 1 else ''}"
                          + (f" ({_names(named)})" if named else "") + idle + (f": {line}" if line else ""),
                          None, details)
            continue
        hidden = seen.physical is not None and seen.physical > seen.count and cuda_visible is not None
        # torchrun numbers the ranks node after node: this node's first is the count of those before it.
        first = sum(max(1, ctx.options.nproc_on(n.node)) for n in ctx.nodes[:position])
        yield Verdict(Status.FAIL, node.node, _too_few(node, first, ranks, seen, cuda_visible if hidden else None),
                      _fix_too_few(ctx, node, ranks, seen, min(known) if known else 0, hidden), details)


def _too_few(node: NodeFacts, first: int, ranks: int, seen: Sight, hidden_by: str | None) -> str:
    given = visible_var(node, "NVIDIA_VISIBLE_DEVICES")
    count = seen.count or 0      # only called once the count is known
    if hidden_by is not None and seen.physical is not None:
        where = f" (CUDA_VISIBLE_DEVICES={hidden_by!r} hides {seen.physical - count} of {seen.physical})"
    elif given is not None and given != "all":
        # The container runtime gave the container these GPUs; the driver inside lists only them.
        where = f" (its container was started with NVIDIA_VISIBLE_DEVICES={given})"
    else:
        where = ""
    if count == 0:
        return f"{ranks} rank{'s' if ranks > 1 else ''} per node but {node.node} sees no GPU{where}"
    # The node's first rank past its GPUs shares GPU 0 (LOCAL_RANK % device_count) or asks for a
    # GPU that is not there (cuda:LOCAL_RANK).
    extra = first + count
    device = nccl_device(seen.devices[0].pci_bus_id) if seen.devices else "…"
    return (f"{ranks} ranks per node but {node.node} sees {count} GPU{'s' if count > 1 else ''}{where}: "
            f"rank {extra} fails with 'Duplicate GPU detected : rank {extra} and rank {first} both on CUDA device "
            f"{device}' (or 'invalid device ordinal' when it picks cuda:LOCAL_RANK)")


def _fix_too_few(ctx: Context, node: NodeFacts, ranks: int, seen: Sight, fewest: int, hidden: bool) -> Fix | None:
    if hidden and seen.physical is not None and seen.physical >= ranks:
        return env_fix(ctx, node.node, [("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(ranks)))])
    if seen.count and node.node in ctx.options.nprocs:      # a hostfile's own slots for this host: its line
        return change(f"slots={seen.count} for {node.node} in the hostfile", node.node)
    if seen.count and fewest:
        return change(f"--nproc-per-node {fewest}", note="the GPUs of the node with the fewest")
    return None         # no GPU at all there: device-dtype says what to do


# --- gpu-memory-held ---------------------------------------------------------------------------

def _holders(driver: DriverView, seen: Sight) -> list[GpuProcess]:
    used = {d.index for d in seen.devices}
    return [p for p in driver.processes if p.gpu in used or p.gpu is None]


def _describe_holder(p: GpuProcess) -> str:
    size = f"{p.used_bytes / MIB:.0f} MiB" if p.used_bytes is not None else "memory"
    where = f" on GPU {p.gpu}" if p.gpu is not None else ""
    if not p.visible_here:
        return f"PID {p.pid} (not in this node's /proc: another container) holds {size}{where}"
    who = f", {p.user}" if p.user else ""
    return describe_process(p)[:-1] + f"{who}) holds {size}{where}"


def check_gpu_memory_held(ctx: Context) -> Iterator[Verdict]:
    skip = cpu_run(ctx)
    if skip:
        yield skip
        return
    for node in ctx.reachable:
        seen, driver = sight(node), driver_of(node)
        if isinstance(driver, Missing) or not seen.devices:
            yield Verdict(Status.SKIP, node.node, _no_devices(node, driver))
            continue
        holders = _holders(driver, seen)
        unseen = [d for d in seen.devices if not any(p.gpu == d.index for p in holders)
                  and (d.memory_used_bytes or 0) > UNSEEN_USE_BYTES]
        details = {"processes": [p.to_json() for p in holders],
                   "gpus": [{"index": d.index, "memory_total_bytes": d.memory_total_bytes,
                             "memory_used_bytes": d.memory_used_bytes} for d in seen.devices]}
        if not holders and not unseen:
            yield Verdict(Status.PASS, node.node,
                          f"no other process holds memory on the {len(seen.devices)} GPU(s) the ranks will use", None, details)
            continue
        leftovers = [p for p in holders if p.why]
        lines = [_describe_holder(p) for p in holders[:4]] + (["and more"] if len(holders) > 4 else [])
        lines += [f"{(d.memory_used_bytes or 0) / MIB:.0f} MiB used on GPU {d.index} by processes "
                  f"{node.node} cannot see (another container or user)" for d in unseen]
        fix = None
        if leftovers:
            fix = run(f"kill {' '.join(str(p.pid) for p in leftovers)}", node.node, f"on {node.node}: leftover training")
        else:
            free = _free_gpus(driver, holders)
            if len(free) >= max(1, ctx.options.nproc_per_node):
                fix = env_fix(ctx, node.node, [("CUDA_VISIBLE_DEVICES", ",".join(free))],
                              note="the GPUs no one else uses")
        orphans = any(p.orphan for p in leftovers)
        yield Verdict(Status.FAIL if orphans else Status.WARN, node.node,
                      f"GPU memory already held on {node.node}: " + "; ".join(lines), fix, details)


def _no_devices(node: NodeFacts, driver: DriverView | Missing) -> str:
    """Why a check about the GPUs the ranks will use has none to look at."""
    if not isinstance(driver, Missing):
        return f"no GPU for the ranks on {node.node} (see gpu-visible)"
    return f"no GPU facts from {node.node}: {driver.reason}"


def _free_gpus(driver: DriverView, holders: list[GpuProcess]) -> list[str]:
    busy = {p.gpu for p in holders}
    return [str(d.index) for d in driver.devices
            if d.index not in busy and (d.memory_used_bytes or 0) <= UNSEEN_USE_BYTES]


# --- gpu-health --------------------------------------------------------------------------------

# nvml.h's clock event (throttle) reasons. The first set slows a GPU that should run full speed;
# the others are normal (idle, clocks set by the admin, power cap under load, sync boost, display).
SLOWDOWNS = {0x8: "HW slowdown", 0x20: "SW thermal slowdown", 0x40: "HW thermal slowdown",
             0x80: "HW power brake slowdown"}
NORMAL_REASONS = {0x1: "idle", 0x2: "applications clocks setting", 0x4: "SW power cap", 0x10: "sync boost",
                  0x100: "display clock setting"}


def clock_reasons(mask: int) -> tuple[list[str], list[str]]:
    """(slowdowns, normal reasons) active in an NVML clock event reasons bitmask."""
    return ([name for bit, name in SLOWDOWNS.items() if mask & bit],
            [name for bit, name in NORMAL_REASONS.items() if mask & bit])


def slowdown_query(node: str, index: int | None) -> Fix:
    return run(f"nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER -i {index}", node, f"on {node}: the slowdown's causes")


@dataclass(frozen=True)
class Finding:
    status: Status
    text: str
    fix: Fix | None = None


def device_findings(node: str, d: GpuDevice, peers: list[GpuDevice]) -> list[Finding]:
    """What is wrong with one GPU; `peers` are the same model's GPUs on the node, for NVLink."""
    i = d.index
    reset = run(f"sudo nvidia-smi -r -i {i}", node, f"on {node}, with nothing running on GPU {i}; or reboot {node}")
    found = []
    if d.error:
        return [Finding(Status.FAIL, f"GPU {i} does not answer ({d.error})",
                        change(f"reboot {node}; if it stays, the GPU needs service", node))]
    if d.ecc_uncorrected_volatile:
        found.append(Finding(Status.FAIL, f"GPU {i} has {d.ecc_uncorrected_volatile} uncorrected ECC errors since the "
                             "driver loaded: results can be wrong, and the next one can end the run", reset))
    if d.remapped_rows_failed:
        found.append(Finding(Status.FAIL, f"GPU {i}: a memory row remapping failed: the GPU needs service"))
    elif d.remapped_rows_pending or d.retired_pages_pending:
        what = "memory rows wait to be remapped" if d.remapped_rows_pending else "memory pages wait to be retired"
        found.append(Finding(Status.WARN, f"GPU {i}: {what}, which happens at the next GPU reset", reset))
    reasons = d.clock_event_reasons
    slow, normal = clock_reasons(reasons) if reasons is not None else ([], [])
    if slow:
        found.append(Finding(Status.WARN, f"GPU {i} is slowed down now ({', '.join(slow)}): it will be the straggler",
                             slowdown_query(node, i)))
    width, widest = d.pcie_width, d.pcie_width_max
    if width and widest and width < widest:
        found.append(Finding(Status.WARN, f"GPU {i}'s PCIe link runs x{width} of x{widest}: less host bandwidth "
                             "(a card not fully seated, or a riser)", None))
    gen, fastest = d.pcie_gen, d.pcie_gen_max
    if gen and fastest and gen < fastest and "idle" not in normal:   # an idle link drops its gen
        found.append(Finding(Status.WARN, f"GPU {i}'s PCIe link runs gen{gen} of gen{fastest} while not idle", None))
    most = max((p.nvlinks_up or 0 for p in peers), default=0)
    up = d.nvlinks_up
    if up is not None and most and up < most:
        found.append(Finding(Status.WARN, f"GPU {i} has {up} NVLinks up, its peers {most}: "
                             "traffic to it falls back to fewer links or PCIe", None))
    return found


def check_gpu_health(ctx: Context) -> Iterator[Verdict]:
    skip = cpu_run(ctx)
    if skip:
        yield skip
        return
    for node in ctx.reachable:
        seen, driver = sight(node), driver_of(node)
        if isinstance(driver, Missing) or not seen.devices:
            yield Verdict(Status.SKIP, node.node, _no_devices(node, driver))
            continue
        devices = [d for d in seen.devices if not d.mig]
        findings = [f for d in devices
                    for f in device_findings(node.node, d, [p for p in devices if p.name == d.name])]
        details = {"gpus": [d.to_json() for d in devices], "source": driver.source,
                   "clock_event_reasons": {str(d.index): sum(clock_reasons(d.clock_event_reasons), [])
                                           for d in devices if d.clock_event_reasons is not None}}
        if not findings:
            unknown = sorted({k for d in devices for k in d.missing})
            yield Verdict(Status.PASS, node.node,
                          f"{len(devices)} GPU(s) healthy: no uncorrected ECC errors or pending repairs, not slowed, "
                          "PCIe at full width" + (f" (not readable here: {', '.join(unknown)})" if unknown else ""),
                          None, details)
            continue
        worst = max(findings, key=lambda f: f.status.severity)
        yield Verdict(worst.status, node.node, "; ".join(f.text for f in findings),
                      next((f.fix for f in findings if f.fix and f.status is worst.status), None), details)
