"""The verdict NCCL's watchdog lines of several ranks support, lined up by process group
(watchdog.py, through finding.py), where hangwatch's join of sequence numbers would say more than
they show: it knows one sequence (a Flight Recorder's default group), and watchdog lines of
several groups or of none joined as one named "rank 7 never entered" with certainty. Flight
Recorder dumps, when read, decide instead (join.py). A paste that shows some ranks of the world
waiting names none of them: the rank they waited for is one the paste does not show."""

from __future__ import annotations

from ddp_preflight.hangwatch.model import Certainty, Evidence, Kind, RankStatus, Reason
from ddp_preflight.rules.failures import FailureKind
from ddp_preflight.rules.fix import change

from . import flight_text
from .finding import QUOTES, Finding
from .join import join
from .root import Root
from .seen import Gathered
from .watchdog import by_groups

WATCHDOG = ("watchdog", "watchdog-status")


def from_watchdog(g: Gathered, finding: Finding | None) -> Root | None:
    if finding is None or finding.message not in WATCHDOG or any(r.flight for r in g.ranks):
        return None
    return _read(g, finding.kind, finding.culprits, finding.detail, list(finding.quotes))


def from_watchdog_lines(g: Gathered) -> Root | None:
    """The same reading of the watchdog lines where another message outranks them in the finding (a crash,
    a store's timeout; in a paste of two runs, the other run's): they make no surer verdict for being second
    (hangwatch's join of their sequence numbers named a certain rank across groups)."""
    hits = [h for h in g.messages.hits if h.message.id in WATCHDOG]
    if not hits or any(r.flight for r in g.ranks):
        return None
    said = by_groups(hits)
    kind = FailureKind.MISMATCH if said.mismatch else FailureKind.RANK_BEHIND if said.behind else \
        FailureKind.TIMEOUT_UNKNOWN_ROOT
    return _read(g, kind, said.behind, said.detail, [h.quote for h in (said.hits or hits)][:QUOTES])


def from_analyzer(g: Gathered) -> Root | None:
    """torch's Flight Recorder analyzer's report pasted as text (flight_text.py): what it read from every rank's
    dump decides as the dumps themselves would (join.py), over the watchdog lines of the ranks that waited."""
    found = flight_text.judged(g.messages.analyzed)
    if found is None:
        return None
    _, said = found
    quotes = [q for b in g.messages.analyzed for q in b.quotes][:QUOTES]
    seq, op, shown = said.detail.get("seq"), said.detail.get("op"), {r.rank for r in g.ranks}
    expected = said.detail.get("expected") or []
    if said.kind is FailureKind.RANK_BEHIND:
        extra = [Evidence("", None, r, RankStatus.UNKNOWN, Reason.BEHIND, notes=(f"its dump holds no #{seq} {op}",))
                 for r in said.culprits]
        kind, reason, sure = Kind.DEADLOCK, Reason.BEHIND, Certainty.CERTAIN
    elif said.kind is FailureKind.MISMATCH and said.culprits:
        extra = [Evidence("", None, r, RankStatus.COLLECTIVE, op=said.detail.get("found", {}).get(str(r)) or f"{op} "
                          "(other sizes or dtypes)", notes=(f"its dump: #{seq}", *(e for e in said.detail.get("errors", ())
                                                                                  if e.startswith(f"rank {r}:"))))
                 for r in said.culprits]
        kind, reason, sure = Kind.MISMATCH, Reason.DIFFERENT_COLLECTIVE, Certainty.LIKELY
    else:
        return None
    # the analyzer's word, not each dump's last collective: no sequence number of theirs is known beyond it
    extra += [Evidence("", None, r, RankStatus.COLLECTIVE, op=op, notes=(f"its dump: #{seq} {op}",)) for r in expected
              if r not in said.culprits]
    return Root(kind, reason, culprits=list(said.culprits), certainty=sure, quotes=quotes, named_by_words=False,
                extra=tuple(e for e in extra if e.rank not in shown))


def _read(g: Gathered, kind: FailureKind, culprits: tuple[int, ...], detail: dict, quotes: list) -> Root | None:
    if kind is FailureKind.MISMATCH:
        ops = detail.get("ops", {})
        return Root(Kind.MISMATCH, Reason.DIFFERENT_COLLECTIVE, candidates=sorted(int(r) for r in ops),
                    certainty=Certainty.UNSURE, quotes=quotes, named_by_words=False,
                    unknown_why=f"their watchdog lines show two collectives at one sequence number of process group "
                                f"{detail.get('group')}; which rank diverged they do not say")
    if kind is FailureKind.RANK_BEHIND:
        return Root(Kind.DEADLOCK, Reason.BEHIND, culprits=list(culprits), certainty=Certainty.LIKELY,
                    quotes=quotes, named_by_words=False)
    joined = join(g.ranks, g.world)
    if joined is not None and joined.behind:
        # the join would name a rank from lines of several groups (or of none): say what they show
        waited = sorted(r.rank for r in g.ranks if r.watchdog is not None and r.rank is not None)
        return Root(Kind.NETWORK_STALL, Reason.TIMED_OUT, candidates=list(waited), certainty=Certainty.UNSURE,
                    quotes=quotes, unknown_why="their watchdog lines are of different process groups, or name none: "
                                               "sequence numbers of different groups cannot be compared, and each "
                                               "rank's Flight Recorder says which rank never entered")
    return _partial(g, quotes)


def _partial(g: Gathered, quotes: list) -> Root | None:
    """Every rank the paste shows timed out waiting, and ranks of the world are missing from it (the
    world a line states, or the ranks below the highest one shown): the one they waited for is among
    those, or is nowhere in the paste; say which are missing and whose log to paste next."""
    shown = {r.rank for r in g.ranks if r.rank is not None}
    waited = {r.rank for r in g.ranks if r.rank is not None and (r.watchdog is not None or r.enqueued is not None)}
    if not waited or waited != shown:
        return None
    worlds = g.messages.worlds | ({g.world} if g.world else set())
    world = max(worlds) if worlds and max(worlds) > max(shown) else None
    missing = sorted(set(range(world if world is not None else max(shown))) - shown)
    if not missing:
        return None
    of = f" of a world of {world}" if world is not None else ""
    shown_text = ("rank " if len(shown) == 1 else "ranks ") + ",".join(map(str, sorted(shown)))
    extra = tuple(Evidence("", None, rank, RankStatus.UNKNOWN, notes=("not in the paste",),
                           unseen="not in the paste") for rank in missing)
    return Root(Kind.UNSEEN, Reason.TIMED_OUT, candidates=list(missing) if world is not None else [],
                certainty=Certainty.UNSURE, quotes=quotes, named_by_words=False, extra=extra,
                unknown_why=f"the paste shows {shown_text}{of}, waiting: the rank {'it' if len(shown) == 1 else 'they'} "
                            f"waited for is one it does not show",
                fix=change(f"paste rank {missing[0]}'s log too (every rank's, or ddp-preflight explain all of them)",
                           note="its own error, or where it stopped, is in it"))
