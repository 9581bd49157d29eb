"""Why a probe's job on a node gave no result, from how it ended (its supervisor's outcome): its
bound, a stop and whose, a signal and from whom, its exit, its last words. A probe that cannot
finish is an error of the probe, said with this reason; never an empty one, never a verdict on
the network (issue 38: under load, "the probe gave no result: " with nothing after it)."""

from __future__ import annotations

import signal

from transport.node import JobResult


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
