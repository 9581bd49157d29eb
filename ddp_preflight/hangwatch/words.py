"""The words for ranks, places, exits and causes, shared by every verdict's text (text.py,
ended_text.py) and the views (the dashboard, explain's renderer, the launch summary): "ranks
0-31,33-63", "all_reduce at train.py:88 (step)", "signal 9, SIGKILL", a cause and its fixes.
Pure; nothing decides from these strings."""

from __future__ import annotations

import signal as signals
from collections.abc import Iterable, Sequence

from ddp_preflight.node.protocol import ExitStatus

from .model import Cause, Diagnosis, Evidence, NodeNote, Unnumbered, Who
from .model import RankStatus as S
from .who import who  # noqa: F401  (the words for ranks: who.py holds them, for the decision modules too)


def ranks_of(keys: Iterable[Who]) -> str:
    """Ranks by number, runs compressed ("ranks 0-31,33-63", "rank 32"), then the ranks whose
    number is unknown by their pid ("rank 3 and pid 4242"): 64 ranks in one line."""
    keys = list(keys)
    numbered = [r for r in keys if isinstance(r, int)]
    pids = sorted(r.pid for r in keys if isinstance(r, Unnumbered) and r.pid is not None)
    parts = [ranks(numbered)] if numbered else []
    parts += [("pid " if len(pids) == 1 else "pids ") + ",".join(map(str, pids))] if pids else []
    return " and ".join(parts)


def wait(keys: Sequence[Who]) -> str:
    return who(keys) + (" waits" if len(keys) == 1 else " wait")


def at(e: Evidence) -> str:
    return f" at {e.frame} ({e.function})" if e.frame else ""


def describe(e: Evidence) -> str:
    """Where a rank is: "all_reduce at train.py:88 (step)", "idle at train.py:80 (main)"."""
    if e.state is S.GPU_WAIT:
        return f"waiting on its GPU ({e.op}){at(e)}"
    if e.state is S.EXITED:
        return f"exited ({e.exit or 'its code unread'})"
    if e.state is S.IMPORTING and e.op:
        return f"importing {e.op}{at(e)}"
    return f"{e.op if e.state is S.COLLECTIVE else e.state.value}{at(e)}"


def ops(ranks: Iterable[Evidence]) -> str:
    return "/".join(sorted({f"the GPU ({e.op})" if e.state is S.GPU_WAIT else
                            "init_process_group" if e.state is S.RENDEZVOUS else str(e.op) for e in ranks}))


def evidence_line(e: Evidence) -> str:
    """One rank as the verdict saw it, for the report and the dashboard."""
    what = describe(e)
    if e.reason is not None:
        what += f" [{e.reason.value}]"
    if e.exception is not None:
        what += f"; {e.exception.type}: {first_line(e.exception.message)} ({e.exception.source})"
    if e.seq is not None:
        what += f"; last collective #{e.seq}"
    notes = "; ".join(((f"torchrun, node rank {e.node_rank}",) if e.node_rank is not None else ()) + tuple(e.notes))
    return f"{e.label} on {e.node}: {what}" + (f" ({notes})" if notes else "")


def first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:200] + ("..." if len(line) > 200 else "")


def byte_count(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def ranks(numbers: Iterable[int]) -> str:
    """"rank 3", "ranks 0,1,3", "ranks 0-31,33-63"."""
    numbers = sorted(set(numbers))
    return ("rank " if len(numbers) == 1 else "ranks ") + ranges(numbers)


def ranges(numbers: Iterable[int]) -> str:
    """Rank numbers compressed: runs of three or more as first-last ("0-31,33-63"), shorter runs
    listed ("0,1,3"), so 64 ranks read in one line."""
    numbers = sorted(set(numbers))
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ",".join(f"{run[0]}-{run[-1]}" if len(run) >= 3 else ",".join(map(str, run)) for run in runs)


def signal_name(status: ExitStatus | None) -> str:
    """ExitStatus(signal=9) -> "signal 9, SIGKILL"; an exit code as it is."""
    if status is None:
        return "its code unread"
    if status.signal is None:
        return str(status)
    try:
        return f"{status}, {signals.Signals(status.signal).name}"
    except ValueError:
        return str(status)


def by_key(d: Diagnosis) -> dict[Who, Evidence]:
    return {e.key: e for e in d.evidence}


def cause_line(c: Cause) -> str:
    """A cause and its fixes, as one line: "uneven data ...: one rank ran out of batches. Fix:
    equal shards per rank, a DistributedSampler with drop_last=True, or ..." (any one fix is
    enough)."""
    if not c.fixes:
        return c.what
    fixes = [f.text() for f in c.fixes]
    said = fixes[0] if len(fixes) == 1 else ", ".join(fixes[:-1]) + ", or " + fixes[-1]
    return f"{c.what}. Fix: {said}" if c.what else f"Fix: {said}"


def note_line(n: NodeNote) -> str:
    """What preflight said of a node: "worker1: data-shards: 1 shard here, 4 on master"."""
    said = f"{n.check}: {n.said}" if n.check else n.said
    return f"{n.node}: {said}" if n.node else said
