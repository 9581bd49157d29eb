"""Why a probe's job on a node gave no result, from how it ended (its supervisor's outcome): its
bound, a stop and whose, a signal and from whom, its exit, its last words. A probe that cannot
finish is an error of the probe, said with this reason; never an empty one, never a verdict on
the network (issue 38: under load, "the probe gave no result: " with nothing after it)."""

from __future__ import annotations

import signal
from collections.abc import Iterable

from ddp_preflight.rules.facts import Missing, NodeFacts
from ddp_preflight.transport.node import JobResult

# A probe's bounds are for an idle node; on a node whose runnable processes outnumber its CPUs,
# each of the job's processes gets a CPU 1/load-per-CPU of the time, and its bound grows as much,
# up to this many times (a node that slow is said, with its load, rather than waited on for ever).
MOST_SLOWDOWN = 4.0


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def why_ended(result: JobResult, bound: float | None = None) -> str:
    """One line: what ended the job, by whom, and what it said last."""
    if result.error:
        return result.error
    words = (result.stderr or "").strip().splitlines()
    last = f"; its last words: {words[-1].strip()[:300]}" if words else ""
    if result.timed_out:
        limit = f" of {bound:.0f} s" if bound else ""
        return (f"its node's supervisor ended it at its bound{limit}, after {result.seconds:.0f} s: the node was too "
                f"slow to finish (load), or it waited on a peer{last}")
    if result.outwaited is not None:
        limit = f" ({bound:.0f} s)" if bound else ""
        return (f"ddp-preflight stopped it when its own wait of {result.outwaited:.0f} s for the job ran out; the "
                f"job had run {result.seconds:.0f} s on the node, and its bound there{limit} had not ended it "
                f"(it started late, or ran slowly){last}")
    if result.stopped == "asked":
        return f"ddp-preflight stopped it after {result.seconds:.0f} s, before it reported{last}"
    if result.stopped == "master-silent":
        return (f"its node's supervisor stopped it after {result.seconds:.0f} s: ddp-preflight's line to the node went "
                f"silent for longer than its lease (this machine too slow to answer, or the link lost){last}")
    if result.signal:
        return (f"it was killed by {signal_name(result.signal)} after {result.seconds:.0f} s, from outside "
                f"ddp-preflight (neither its bound nor a stop of ours: another process, or the OOM killer){last}")
    if result.exit not in (None, 0):
        return f"it exited with code {result.exit} after {result.seconds:.0f} s{last or ', saying nothing'}"
    return f"it ended after {result.seconds:.0f} s without its result line{last or ', saying nothing'}"


def ended_by_us_or_outside(result: JobResult) -> bool:
    """The job did not end by itself: its bound, a stop (ours, or its supervisor's when the master
    went silent), or a signal from outside. What it printed then (torchrun's SignalException of
    the SIGTERM that ends it) is how it was ended, not a finding of the probe."""
    return result.error is None and bool(result.timed_out or result.stopped or result.signal
                                         or result.outwaited is not None)


def load_per_cpu(node: NodeFacts) -> float | None:
    cpu = node.parsed.cpu if node.error is None else None
    return None if cpu is None or isinstance(cpu, Missing) else cpu.load_per_cpu


def slowdown(nodes: Iterable[NodeFacts]) -> float:
    """How much longer a probe's job may take on the busiest of these nodes: its runnable
    processes per CPU as its facts read it, from 1 (idle) to MOST_SLOWDOWN."""
    loads = [load for load in map(load_per_cpu, nodes) if load is not None]
    return min(MOST_SLOWDOWN, max([1.0, *loads]))


def load_words(node: NodeFacts) -> str:
    """'; worker1 was at load 151 on 2 CPUs' where the node was busier than its CPUs, else ''."""
    load = load_per_cpu(node)
    cpu = node.parsed.cpu
    if load is None or load <= 1 or isinstance(cpu, Missing) or cpu.load is None:
        return ""
    cpus = cpu.usable_cores or cpu.logical_cores
    return f"; {node.node} was at load {cpu.load:.0f} on {cpus} CPU{'s' if cpus != 1 else ''}"
