"""bandwidth and compute-balance: what the link and each node's compute will cost every step.

Bus bandwidth is nccl-tests' figure for all_reduce: busbw = algbw x 2(n-1)/n, where algbw is bytes / seconds.
A ring all_reduce moves 2(n-1)/n x the gradient bytes through every rank, so one step's all_reduce of G
gradient bytes takes about 2(n-1)/n x G / busbw (about 2 G / busbw for many nodes)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

from ddp_preflight.rules.environment import env_fix
from ddp_preflight.rules.facts import Missing
from ddp_preflight.rules.fix import Fix, change

from ..model import Context, NodeFacts, Status, Verdict
from ..probes.bandwidth_seen import BandwidthSeen, ComputeSeen, GpuFigures, JobFailure, NodeFigures
from .bandwidth_links import (
    SLOW_KINDS,
    STRAGGLER_RATIO,
    by_wire,
    capped_link,
    describe,
    links,
    links_carrying,
    lossy_paths,
    slow_node_of,
    slowest_link,
)
from .causes import NOT_KNOWN, because, is_gpu_error, likely_causes, symptom_of, unfinished
from .common import probed
from .gpu import clock_reasons, sight, slowdown_query
from .units import count, duration, megabytes, rate, size

GRADIENT_BYTES = 4          # per parameter: DDP all-reduces fp32 gradients (autocast keeps parameters fp32)
SLOW_STEP_SECONDS = 1.0     # communication per step above this is felt, whatever the model computes
REFERENCE_PARAMS = 100_000_000


def step_seconds(params: int, world: int, busbw: float) -> tuple[float, float]:
    """Bytes each rank moves per step for params' fp32 gradients, and the seconds that takes."""
    moved = 2 * (world - 1) / world * params * GRADIENT_BYTES
    return moved, moved / busbw


def check_bandwidth(ctx: Context) -> Iterator[Verdict]:
    seen, early = probed(ctx, "bandwidth", BandwidthSeen.from_json)
    if seen is None:
        yield from [early] if early else []
        return
    if seen.failed is not None:
        yield _job_failed(ctx, seen.failed)
        return
    world, busbw = seen.world_size, seen.busbw
    latency = seen.latency_us["8"]
    one_node = len(seen.nodes) == 1      # one GPU node: the link between its GPUs
    found = {} if one_node else links(ctx, list(seen.nodes))
    slow = slowest_link(found)
    between = f"{world} GPUs of {seen.nodes[0]}" if one_node else f"{world} nodes"
    figures = (f"all_reduce latency {latency / 1000:.2f} ms (8 B), bus bandwidth {rate(busbw)} "
               f"({size(seen.message_bytes)} messages, {between})")
    speeds = {link["speed_mbit"] for link in found.values() if link.get("speed_mbit")}
    where = f"; slowest link: {describe(*slow)}" if slow else \
        f"; links {min(speeds)} Mbit/s nominal" if speeds else ""
    yield from lossy_paths(ctx, seen)
    # The node whose links are slow against the others' (three nodes or more), else a link its
    # sender's own queue holds at a cap below its nominal speed (any number of nodes).
    slow_node = slow_node_of(ctx, seen) or capped_link(ctx, seen)
    if slow_node is not None:
        yield slow_node
    details: dict[str, Any] = {"latency_us": dict(seen.latency_us), "busbw_bytes_per_s": busbw,
               "algbw_bytes_per_s": seen.algbw, "bytes": seen.message_bytes, "seconds": seen.seconds,
               "world_size": world, "links": found, "slowest_link": slow[0] if slow else None}
    measured = {f"{link.src}->{link.dst}": {
        "bytes_per_s": round(link.least_rate or 0), "sent": link.sent, "busy_us": link.busy_us, "rtt_us": link.rtt_us,
        "retrans": link.retrans, "segs": link.segs, "lost": link.lost} for link in links_carrying(seen)}
    if measured:
        details["measured_links"] = measured      # each link on its own: bytes over the time it had data to send

    params = ctx.options.params
    if not params:
        moved, seconds = step_seconds(REFERENCE_PARAMS, world, busbw)
        yield Verdict(Status.PASS, None,
                      f"{figures}{where}. For scale: a {count(REFERENCE_PARAMS)}-parameter model's fp32 gradients "
                      f"would take about {duration(seconds)} per step (--params N predicts yours)", None,
                      {**details, "reference": {"params": REFERENCE_PARAMS, "bytes_per_rank": moved,
                                               "seconds": seconds}})
        return
    moved, seconds = step_seconds(params, world, busbw)
    details["prediction"] = {"params": params, "bytes_per_element": GRADIENT_BYTES, "bytes_per_rank": moved,
                             "seconds": seconds, "threshold_seconds": SLOW_STEP_SECONDS}
    predicted = (f"{count(params)} parameters: each step all-reduces {megabytes(params * GRADIENT_BYTES)} of "
                 f"fp32 gradients (a ring moves {megabytes(moved)} through every rank), about {duration(seconds)} "
                 f"at {rate(busbw)}")
    if seconds <= SLOW_STEP_SECONDS:
        yield Verdict(Status.PASS, None, f"{figures}{where}. {predicted}", None, details)
        return
    tokens = _break_even_tokens(ctx, params, seconds)
    if tokens:
        details["prediction"]["break_even_tokens_per_rank"] = tokens
    compute = (f"; a rank must compute more than about {int(float(f'{tokens:.2g}')):,} tokens per step before "
               "compute, not the link, sets the pace" if tokens else "")
    if slow and slow[1]["kind"] in SLOW_KINDS:
        name, link = slow
        yield Verdict(Status.WARN, name,
                      f"{predicted}: the link, not compute, will bound the run{compute}. The slowest link is "
                      f"{describe(name, link)}: every step's all_reduce crosses it. {figures}",
                      by_wire(ctx, name), details)
        return
    less_often = "all-reduce less often: accumulate gradients over several micro-batches inside model.no_sync()"
    # The node the links measured slow, where one was (its own warning names its links), else the
    # slowest by kind or nominal speed.
    # The slow node's own cause, where its links' verdict saw one (a queue that caps it): one fix.
    yield Verdict(Status.WARN, slow_node.node if slow_node else slow[0] if slow else None,
                  f"{predicted}: the link, not compute, will bound the run{compute}"
                  f"{f'; the slow node: {slow_node.node}' if slow_node else where}. {figures}",
                  slow_node.fix if slow_node and "shaper" in slow_node.details else
                  change(less_often if one_node else f"use a faster link between the nodes, or {less_often}"), details)


def _job_failed(ctx: Context, failed: JobFailure) -> Verdict:
    """The job ran and failed: its own error, and the cause only where another check saw it."""
    if failed.unfinished:      # stopped, or killed from outside: an error of the probe, never the network's
        return unfinished("the all_reduce probe", failed.node, failed.error, failed.load_per_cpu, failed.to_json())
    causes = likely_causes(ctx, symptom_of(failed.error, failed.timed_out))
    said, fix = because(causes)
    return Verdict(Status.ERROR, None, f"the all_reduce job failed on {failed.node}: {failed.error}{said}", fix,
                   {"failed": failed.to_json(), "likely_causes": [c.to_json() for c in causes]})


def _break_even_tokens(ctx: Context, params: int, seconds: float) -> int | None:
    """Tokens per rank whose compute (about 6 FLOP per parameter per token, forward and
    backward) takes as long as the step's communication on the slowest measured node."""
    rates = [f.gflops for f in ComputeSeen.from_json(ctx.probes.get("compute") or {}).nodes.values()]
    if not rates:
        return None
    return int(seconds * min(rates) * 1e9 / (6 * params))


def _threads(figures: NodeFigures) -> str:
    n = figures.threads
    said = f"{n} thread{'s' if n != 1 else ''}, {figures.threads_from}"
    if figures.cpus_usable and n and figures.cpus_usable < n:
        said += f", {figures.cpus_usable:g} CPUs usable"
    return said


def _shared(measured: Mapping[str, NodeFigures]) -> str:
    """What a reader needs when a node's timed products were slowed by its neighbours."""
    busy = [name for name, f in measured.items() if f.shared]
    if not busy:
        return ""
    return (f"; {', '.join(busy)} computed {'its' if len(busy) == 1 else 'their'} timed products slower "
            f"({', '.join(f'{measured[n].gflops:.0f}' for n in busy)} GFLOP/s): other processes took the cores "
            "while it was measured, and one thread's CPU-clocked rate times its threads is what it computes alone")


def _one_machine(ctx: Context, measured: Mapping[str, NodeFigures]) -> tuple[dict[str, NodeFigures], str]:
    """Nodes that run on one kernel (the same boot_id: containers or namespaces of one machine)
    compute on the same cores: a thread there computes what a thread there computes, and a lower
    figure measured on one of them is the others' load on those cores at that moment, not its
    core. Their one-thread rate is the best measured among them; their threads and quotas still
    set them apart (the straggler with fewer threads stays one)."""
    boots: dict[str, list[str]] = {}
    for node in ctx.nodes:
        facts = node.parsed.os
        boot = None if isinstance(facts, Missing) else facts.boot_id
        if boot and node.node in measured and measured[node.node].thread_gflops:
            boots.setdefault(boot, []).append(node.node)
    out, said = dict(measured), []
    for names in boots.values():
        if len(names) < 2:
            continue
        best = max(measured[n].thread_gflops or 0.0 for n in names)
        for name in names:
            out[name] = replace(measured[name], thread_gflops=best)
        said.append(f"; {' and '.join(names)} run on one machine (one kernel: the same boot_id), so their cores are "
                    f"compared as one machine's, at the best one-thread rate measured there ({best:.0f} GFLOP/s)")
    return out, "".join(said)


def check_compute_balance(ctx: Context) -> Iterator[Verdict]:
    seen, early = probed(ctx, "compute", ComputeSeen.from_json)
    if seen is None:
        yield from [early] if early else []
        return
    for name, reason in seen.errors.items():
        said, fix = because(likely_causes(ctx, "gpu") if is_gpu_error(reason) else [])
        yield Verdict(Status.ERROR, name, f"{name}: the matmul benchmark did not run: {reason}{said}", fix)
    measured = seen.nodes
    if not measured:
        return
    if any("gpus" in f.sent for f in measured.values()):
        yield from _gpu_balance(ctx, measured)
        return
    measured, alike = _one_machine(ctx, measured)
    fastest_node = max(measured, key=lambda n: measured[n].rate)
    top = measured[fastest_node].rate
    listed = ", ".join(f"{name} {f.rate:.0f} GFLOP/s ({_threads(f)})" for name, f in measured.items())
    details = {"nodes": {name: f.to_json() for name, f in measured.items()}, "fastest": fastest_node,
               "threshold_ratio": STRAGGLER_RATIO,
               "rates": {name: f.rate for name, f in measured.items()}}
    slow = sorted((n for n in measured if measured[n].rate < STRAGGLER_RATIO * top),
                  key=lambda n: measured[n].rate)
    shared = _shared(measured) + alike
    if not slow:
        balance = (f"all within {STRAGGLER_RATIO}x of the fastest" if len(measured) > 1
                   else "one node, no one to wait for")
        yield Verdict(Status.PASS, None, f"fp32 matmul: {listed}; {balance}{shared}", None, details)
        return
    by_name = {n.node: n for n in ctx.nodes}
    others = f". All: {listed}" if len(measured) > 2 else ""
    for name in slow:
        figures = measured[name]
        slowdown = top / figures.rate
        role = "the straggler every synchronous step waits for" if name == slow[0] else "also slower than the rest"
        yield Verdict(Status.WARN, name,
                      f"{name} is {role}: {figures.rate:.0f} GFLOP/s ({_threads(figures)}) against {fastest_node}'s "
                      f"{top:.0f} GFLOP/s ({_threads(measured[fastest_node])}): every synchronous step's compute takes "
                      f"about {slowdown:.1f}x as long as at {fastest_node}'s pace{others}{shared}",
                      _straggler_fix(ctx, name, figures, measured[fastest_node], by_name.get(name)),
                      {**details, "straggler": name, "slowdown": round(slowdown, 2)})


def _straggler_fix(ctx: Context, name: str, slow: NodeFigures, fast: NodeFigures, node: NodeFacts | None) -> Fix:
    nproc = ctx.options.nproc_on(name)
    cpu = node.parsed.cpu if node is not None else Missing("not one of the nodes")
    cores = (None if isinstance(cpu, Missing) else cpu.physical_cores) or slow.cpus or 1
    best = max(1, cores // max(1, nproc))
    if (slow.threads or 0) < (fast.threads or 0) and (slow.threads or 0) < best:
        return env_fix(ctx, name, [("OMP_NUM_THREADS", str(best))],
                       note=f"{cores} cores, {nproc} process(es) per node")
    return change(f"DDP gives every rank the same batch, so {name} cannot do less: replace it with a faster machine, "
                  "or leave it out of the host list", name)


# --- compute-balance on the GPUs of a CUDA run ----------------------------------------------------

def tflops(gflops: float) -> str:
    return f"{gflops / 1000:.0f} TFLOP/s" if gflops >= 10_000 else f"{gflops / 1000:.1f} TFLOP/s"


def _gpu_words(node: str, gpu: GpuFigures) -> str:
    return f"{node}'s GPU {gpu.index} ({gpu.name or '?'}, {gpu.dtype or '?'})"


def _node_gpus(figures: NodeFigures) -> str:
    gpus = figures.gpus
    if len(gpus) == 1:
        return f"GPU {gpus[0].index} {tflops(gpus[0].gflops)}"
    rates = sorted(g.gflops for g in gpus)
    return f"{len(gpus)} GPUs {tflops(rates[0])} to {tflops(rates[-1])}"


def _gpu_balance(ctx: Context, measured: Mapping[str, NodeFigures]) -> Iterator[Verdict]:
    """Every rank waits for the slowest GPU of the run each step: each node's slowest GPU against
    the fastest GPU of any node (a throttled GPU beside fast ones on one node counts too)."""
    best_node = max(measured, key=lambda n: measured[n].fastest)
    best = max(measured[best_node].gpus, key=lambda g: g.gflops)
    top = best.gflops
    dtypes = sorted({g.dtype or "?" for f in measured.values() for g in f.gpus})
    listed = ", ".join(f"{name} {_node_gpus(f)}" for name, f in measured.items())
    details = {"nodes": {name: f.to_json() for name, f in measured.items()}, "fastest": best_node,
               "fastest_gpu": best.index, "threshold_ratio": STRAGGLER_RATIO}
    slow = sorted((n for n in measured if measured[n].gflops < STRAGGLER_RATIO * top),
                  key=lambda n: measured[n].gflops)
    if not slow:
        count = sum(len(f.gpus) for f in measured.values())
        balance = f"all within {STRAGGLER_RATIO}x of the fastest" if count > 1 else "one GPU, no one to wait for"
        yield Verdict(Status.PASS, None, f"{'/'.join(dtypes)} matmul on the GPUs: {listed}; {balance}", None, details)
        return
    by_name = {n.node: n for n in ctx.nodes}
    for name in slow:
        gpu = measured[name].gpu(measured[name].slowest_gpu)
        slowdown = top / gpu.gflops
        role = "the straggler every synchronous step waits for" if name == slow[0] else "also slower than the rest"
        why, fix = _why_slow(by_name[name], gpu, best)
        yield Verdict(Status.WARN, name,
                      f"{_gpu_words(name, gpu)} is {role}: {tflops(gpu.gflops)} against "
                      f"{_gpu_words(best_node, best)} {tflops(top)}: every synchronous step's compute takes about "
                      f"{slowdown:.1f}x as long as at the fastest GPU's pace; {why}. All: {listed}", fix,
                      {**details, "straggler": name, "straggler_gpu": gpu.index, "slowdown": round(slowdown, 2)})


def _why_slow(node: NodeFacts, gpu: GpuFigures, best: GpuFigures) -> tuple[str, Fix | None]:
    """What the facts say of a slow GPU, and a fix only for what they show."""
    seen = sight(node).devices          # in CUDA's order: rank i's cuda:i is seen[i]
    device = seen[gpu.index] if gpu.index < len(seen) else None
    slowdowns = clock_reasons(device.clock_event_reasons)[0] if device and device.clock_event_reasons else []
    if device is not None and slowdowns:
        return f"gpu-health saw it slowed down ({', '.join(slowdowns)})", slowdown_query(node.node, device.index)
    if gpu.name != best.name:
        fix = change("DDP gives every rank the same batch, so a slower GPU cannot do less: replace it with a faster one, "
                     "or leave its node out of the host list", node.node)
        return f"another model: {gpu.name or '?'} against {best.name or '?'}", fix
    facts = "no slowdown in its facts" if device is not None else "no driver facts of it"
    return f"{NOT_KNOWN}: the same model as the fastest, {facts} (see gpu-health)", None
