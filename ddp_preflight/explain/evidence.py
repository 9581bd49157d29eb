"""Each rank as the files show it, for the verdict (model.Evidence): where it is (its last
collective, from its Flight Recorder or NCCL's watchdog), how it ended, and the line that says so.
What each end was is exits.read's word (one rule with the live watcher); the rule that found the
root says why each rank it names is named."""

from __future__ import annotations

from ddp_preflight.hangwatch.ended import as_seen
from ddp_preflight.hangwatch.model import Evidence
from ddp_preflight.hangwatch.model import RankStatus as S
from ddp_preflight.hangwatch.who import Unnumbered, Who

from .ended import reads
from .join import last_entered
from .root import Root
from .seen import Gathered


def evidence(g: Gathered, root: Root) -> list[Evidence]:
    """Every rank the files name, by rank; then the ranks the rule named that no file shows."""
    entered = {e.rank: e for e in (last_entered(r) for r in g.ranks) if e is not None}
    ends = reads(g)
    out = []
    for seen in sorted(g.ranks, key=lambda r: _order(r.key)):
        key = seen.key
        info = seen.exception
        exception = as_seen(info, seen.source) if info is not None else None
        place = entered.get(seen.rank) if seen.rank is not None else None
        ended = seen.exit is not None or (info is not None and not (place and seen.watchdog))
        lines = seen.quotes or seen.exit_quotes or seen.watchdog_quotes
        read = ends.get(key)
        reason = root.reason if key in root.culprits else root.reasons.get(key, read.reason if read else None)
        out.append(Evidence(
            node=seen.node or "", pid=seen.pid, rank=seen.rank,
            state=S.EXITED if ended else (S.COLLECTIVE if place else S.UNKNOWN), reason=reason,
            op=place.op if place else None,
            frame=(exception.where if exception else None) or (place.frame if place else None) or seen.frame,
            function=info.function if info else None, exit=seen.exit, exception=exception,
            seq=place.seq if place else None, seq_op=place.op if place else None,
            completed=place.completed if place else None, quote=str(lines[0]) if lines else None,
            notes=root.notes.get(key, ()), writer=key.writer if isinstance(key, Unnumbered) else None,
            named_by=root.named_by.get(key)))
    shown = {e.key for e in out}
    return out + [e for e in root.extra if e.key not in shown]


def _order(key: Who) -> tuple[bool, int]:
    return (False, key) if isinstance(key, int) else (True, 0)
