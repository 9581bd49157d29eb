"""The ranks' collectives lined up by sequence number, from what a run left (Flight Recorder dumps,
NCCL's watchdog): the last collective each rank entered; the join itself is hangwatch's
(hangwatch/sequence.py), the one the live verdicts and the dashboard use."""

from __future__ import annotations

from dataclasses import dataclass

from ddp_preflight.hangwatch import sequence
from ddp_preflight.hangwatch.tracebacks import own_code, short_name

from .seen import Quote, RankSeen


@dataclass(frozen=True)
class Entered(sequence.Entered):
    """Where one rank is in its default group's sequence of collectives, and the line that says so."""
    quote: Quote


Joined = sequence.Joined[Entered]


def last_entered(seen: RankSeen) -> Entered | None:
    """A rank's last collective on its first (default) process group, from its Flight Recorder or,
    failing that, NCCL's watchdog lines."""
    if seen.rank is None:
        return None
    flight = seen.flight
    if flight:
        summary = flight.get("summary")
        if summary:
            return Entered(seen.rank, summary["seq"], summary.get("op"), summary.get("completed"),
                           flight.get("frame") or seen.frame, Quote(flight["path"], None, f"rank {seen.rank}: last collective "
                                                                           f"#{summary['seq']} {summary.get('op')}"))
        best, completed = None, None
        for entry in flight["entries"]:
            if not isinstance(entry, dict) or entry.get("is_p2p"):
                continue
            group = entry.get("process_group")
            if isinstance(group, (list, tuple)) and group and str(group[0]) not in ("0", "default_pg"):
                continue
            seq = entry.get("collective_seq_id")
            if not isinstance(seq, int):
                continue
            if entry.get("state") == "completed":
                completed = max(seq, completed if completed is not None else seq)
            if best is None or seq > best.get("collective_seq_id", -1):
                best = entry
        status = flight.get("pg_status") or {}
        default = status.get("0") if isinstance(status, dict) else None
        if isinstance(default, dict) and isinstance(default.get("last_completed_collective"), int):
            completed = max(completed or -1, default["last_completed_collective"]) if completed is not None \
                else default["last_completed_collective"]
        if best is None:
            return None
        op = str(best.get("profiling_name") or "").split(":")[-1] or None
        own = _own_frame(best.get("frames"))       # what the dump itself says (its quote says no more)
        frame = own or seen.frame
        return Entered(seen.rank, best["collective_seq_id"], op, completed if completed is not None and
                       completed >= 0 else None, frame,
                       Quote(flight["path"], None, f"rank {seen.rank}: collective #{best['collective_seq_id']} {op} "
                                                   f"{best.get('state')}" + (f" at {own}" if own else "")))
    if seen.watchdog is not None and seen.watchdog.seq is not None:
        return Entered(seen.rank, seen.watchdog.seq, seen.watchdog.op, seen.completed, None, seen.watchdog_quotes[0])
    return None


def _own_frame(frames) -> str | None:
    """The innermost frame of the training's own code in an entry's stack (torch records the
    Python stack of each collective: innermost first)."""
    if not isinstance(frames, list):
        return None
    for frame in frames:
        if isinstance(frame, dict) and isinstance(frame.get("filename"), str) and own_code(frame["filename"]):
            return f"{short_name(frame['filename'])}:{frame.get('line')}"
    return None


def join(ranks: list[RankSeen], world: int | None = None) -> Joined | None:
    return sequence.join(e for e in (last_entered(r) for r in ranks) if e is not None)
