"""The verdict NCCL's watchdog lines of several ranks support, lined up by process group
(watchdog.py, through finding.py), where hangwatch's join of sequence numbers would say more than
they show: it knows one sequence (a Flight Recorder's default group), and watchdog lines of
several groups or of none joined as one named "rank 7 never entered" with certainty. Flight
Recorder dumps, when read, decide instead (join.py)."""

from __future__ import annotations

from hangwatch.model import Certainty, Kind, Reason
from rules.failures import FailureKind

from .finding import Finding
from .join import join
from .root import Root
from .seen import Gathered

WATCHDOG = ("watchdog", "watchdog-status")


def from_watchdog(g: Gathered, finding: Finding | None) -> Root | None:
    if finding is None or finding.message not in WATCHDOG or any(r.flight for r in g.ranks):
        return None
    quotes = list(finding.quotes)
    if finding.kind is FailureKind.MISMATCH:
        ops = finding.detail.get("ops", {})
        return Root(Kind.MISMATCH, Reason.DIFFERENT_COLLECTIVE, candidates=sorted(int(r) for r in ops),
                    certainty=Certainty.UNSURE, quotes=quotes, named_by_words=False,
                    unknown_why=f"their watchdog lines show two collectives at one sequence number of process group "
                                f"{finding.detail.get('group')}; which rank diverged they do not say")
    if finding.kind is FailureKind.RANK_BEHIND:
        return Root(Kind.DEADLOCK, Reason.BEHIND, culprits=list(finding.culprits), certainty=Certainty.LIKELY,
                    quotes=quotes, named_by_words=False)
    joined = join(g.ranks, g.world)
    if joined is not None and joined.behind:
        # the join would name a rank from lines of several groups (or of none): say what they show
        waited = sorted(r.rank for r in g.ranks if r.watchdog is not None and r.rank is not None)
        return Root(Kind.NETWORK_STALL, Reason.TIMED_OUT, candidates=list(waited), certainty=Certainty.UNSURE,
                    quotes=quotes, unknown_why="their watchdog lines are of different process groups, or name none: "
                                               "sequence numbers of different groups cannot be compared, and each "
                                               "rank's Flight Recorder says which rank never entered")
    return None
