"""The verdict rules for a stalled run whose ranks wait in collectives or on their GPUs (diagnose.py
orders them with the others): who they wait for (a rank that works, ended, or is stuck outside
the collective), or, when every rank waits, what the places they wait at say (a mismatch, a rank
behind, a GPU, a cycle of receives, a slow or a lost link); and the ranks nobody sees. Each rule
is a pure function of the run's evidence (stalled.Stall) that decides a verdict or passes (None)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from . import sequence
from .causes import CAUSES, END_OF_ITS_DATA
from .classify import GENERIC_WAITS
from .model import Certainty, Diagnosis, Evidence, Kind, Reason
from .model import RankStatus as S
from .stalled import Stall, held_up_by
from .who import Who

P2P = "send/recv"
CANNOT_TELL = "a hang cannot be told from a straggler"
# What a rank outside any collective may be doing that ends by itself: asleep in its code, reading
# stdin, a pipe or a socket, waiting on a disk, waiting for a batch its DataLoader workers have not
# brought (a worker that sleeps or reads a slow file looks the same as one that never returns; a
# worker gone is the rank's own error: torch raises "DataLoader worker ... exited unexpectedly").
# A lock, a stop, a loop it left: never by itself.
MAY_END = frozenset({Reason.SLEEPS, Reason.WAITS_TO_RECEIVE, Reason.WAITS_ON_IO, Reason.IDLE_IN_LOOP,
                     Reason.WAITS_FOR_DATA})
APART = ("they wait in it at different lines: a collective of a subgroup, or one only some ranks call; which rank "
         "diverged cannot be told from where they wait (the Flight Recorder's numbers per group would say)")


def straggler(s: Stall) -> Diagnosis | None:
    """Ranks wait while another works: it may arrive (a straggler), or never (endless)."""
    if s.waiting and s.busy:
        return held_up_by(s, s.busy, s.evidence)
    return None


def ended_first(s: Stall) -> Diagnosis | None:
    """Ranks wait while others of the run ended: the ends no other explains (exits.judge's verdict,
    with every rank's evidence), or, when that names none, the ranks that ended."""
    exited = s.where(S.EXITED)
    if not (s.waiting and exited):
        return None
    if s.ended is not None and s.ended.named:
        return replace(s.ended, evidence=_merged(s.ended.evidence, s.evidence))
    return Diagnosis(kind=Kind.EXITED, culprits=tuple(sorted(exited)), reason=Reason.FAILED,
                     certainty=Certainty.LIKELY, evidence=s.evidence, causes=CAUSES[Reason.FAILED])


def deadlock(s: Stall) -> Diagnosis | None:
    """Ranks wait in a collective while others are stuck outside it: those are to blame."""
    halted = s.halted
    if not (s.waiting and halted):
        return None
    reasons = [e.reason for _, e in sorted(halted.items()) if e.reason is not None]
    reason = reasons[0] if reasons else Reason.LEFT_LOOP
    if all(e.reason in MAY_END for e in halted.values()) and (s.waited is None or s.waited < s.held_after):
        return held(s, halted, reason)
    # Seen outside the collective the others wait in, at a place its wait cannot end by itself (it
    # left its loop, a lock, the kernel stopped it), or past the bound of one that could: certain,
    # unless a rank nobody sees could be the one (it is named beside them, "unknown").
    certainty = Certainty.CERTAIN if not s.unknown else Certainty.LIKELY
    causes = CAUSES.get(reason, ())
    # One behind by the Flight Recorder: its cause too, unless the reason's causes say it already
    # (left the loop: uneven data and its fixes, said once).
    said = {fix for c in causes for fix in c.fixes}
    behind = tuple(c for c in CAUSES[Reason.BEHIND] if not (c.fixes and set(c.fixes) <= said)) \
        if _behind_of(s.waiting, halted) else ()
    return Diagnosis(kind=Kind.DEADLOCK, culprits=tuple(sorted(halted)), reason=reason, certainty=certainty,
                     evidence=s.evidence, causes=causes + behind)


def held(s: Stall, halted: Mapping[Who, Evidence], reason: Reason) -> Diagnosis:
    """Ranks sit in their own code, where a wait may end by itself (asleep: a checkpoint, an
    evaluation's pause, a straggler's sleep; reading stdin, a pipe or a socket; on a disk), while the
    others wait for them: a stall named with its rank, line and function, likely, no hang until
    `s.held_after` has passed (then deadlock, certain)."""
    return Diagnosis(kind=Kind.HELD, culprits=tuple(sorted(halted)), reason=reason, certainty=Certainty.LIKELY,
                     evidence=s.evidence, causes=CAUSES.get(reason, ()),
                     waited=round(s.waited, 1) if s.waited is not None else None,
                     bound=s.held_after if s.held_after != math.inf else None)


def unseen(s: Stall) -> Diagnosis | None:
    """Only ranks nobody sees (no stack, node lost) could be holding the others up, and one of them
    may be computing: never a culprit, never a hang that stops a run. Unless every live rank is
    watched and quiet: then the run is stalled, though who is guilty cannot be told (stacks
    unavailable: no ptrace, no py-spy)."""
    if not s.unknown:
        return None
    if s.quiet is not None:
        return Diagnosis(kind=Kind.STALL, evidence=s.evidence, certainty=Certainty.UNSURE, waited=s.quiet,
                         unknown_why="stacks are unavailable")
    return Diagnosis(kind=Kind.UNSEEN, evidence=s.evidence, unknown_why=CANNOT_TELL)


def unseen_while_waiting(s: Stall) -> Diagnosis | None:
    """Ranks wait, and the ones they may wait for are unseen (before every rank is taken to wait)."""
    return unseen(s) if s.waiting else None


def skipped_in_group(s: Stall) -> Diagnosis | None:
    """Every rank waits, in collectives of different process groups (the Flight Recorder): the
    members of a subgroup that never entered the collective the group's other ranks wait in (and
    wait in another group's). Likely, never certain: the numbers cannot tell a member that skipped
    the subgroup's collective from one that called one more."""
    waiting = s.waiting
    if not waiting or len(waiting) < len(s.ranks):
        return None
    found = sequence.skipped_in_group(waiting.values())
    if found is None:
        return None
    return Diagnosis(kind=Kind.MISMATCH, culprits=found.behind, reason=Reason.SKIPPED_GROUP,
                     certainty=Certainty.LIKELY, evidence=s.evidence, causes=CAUSES[Reason.SKIPPED_GROUP],
                     group=found.group, group_ranks=found.members)


def all_waiting(s: Stall) -> Diagnosis | None:
    """Every rank waits. Who is to blame: the ranks in another collective (a mismatch), the ranks at
    another collective number (the Flight Recorder), none in a cycle of receives with nothing in
    flight, the ranks on a GPU that makes no progress; else a peer or the link."""
    waiting, evidence = s.waiting, s.evidence
    if not waiting:
        return None
    # A wait on an async handle (work.wait(), a future) is on some collective: it differs from
    # none. Only named collectives can disagree.
    named = {r: e for r, e in waiting.items() if e.state is S.COLLECTIVE and e.op not in GENERIC_WAITS}
    apart = _odd_ones_out({r: e.op for r, e in named.items()})
    if apart is not None:
        odd, tied = apart
        in_barrier = bool(odd) and all(named[r].op == "barrier" for r in odd)
        return Diagnosis(kind=Kind.MISMATCH, culprits=odd, candidates=tied, reason=Reason.DIFFERENT_COLLECTIVE,
                         certainty=Certainty.CERTAIN if odd else Certainty.UNSURE, evidence=evidence,
                         causes=((END_OF_ITS_DATA,) if in_barrier else ()) + CAUSES[Reason.DIFFERENT_COLLECTIVE],
                         unknown_why=None if odd else "which one took the other branch cannot be told from where "
                                                      "they wait")
    numbered = {r: e.seq for r, e in waiting.items() if e.seq is not None}
    # The default group's numbers line up only ranks that wait in it: one that waits in a
    # subgroup's collective has not reached the default group's next one, and is behind nobody.
    if len(numbered) == len(waiting) and not sequence.across_groups(waiting.values()):
        apart = _odd_ones_out(numbered)
        if apart is not None:
            odd, tied = apart
            return Diagnosis(kind=Kind.MISMATCH, culprits=odd, candidates=tied, reason=Reason.BEHIND,
                             certainty=Certainty.CERTAIN if odd else Certainty.UNSURE, evidence=evidence,
                             causes=CAUSES[Reason.BEHIND],
                             unknown_why=None if odd else "as many ranks are at each collective number: which one "
                                                          "called one collective more or fewer cannot be told")
    on_gpu = sorted(r for r, e in waiting.items() if e.state is S.GPU_WAIT)
    if on_gpu:
        return _on_gpu(s, on_gpu)
    lines = {e.frame for e in named.values()}
    if len(named) == len(waiting) and None not in lines and len(lines) > 1:
        # The same collective at different lines of the training: not one collective. Who diverged
        # (a subgroup's collective, a collective only some ranks call) the places alone cannot say;
        # the groups the ranks' connections show can.
        skipped = skipped_by_connections(s, named)
        if skipped is not None:
            return skipped
        return Diagnosis(kind=Kind.MISMATCH, candidates=tuple(sorted(waiting)), reason=Reason.DIFFERENT_COLLECTIVE,
                         certainty=Certainty.UNSURE, evidence=evidence, causes=CAUSES[Reason.DIFFERENT_COLLECTIVE],
                         unknown_why=APART)
    if all(e.op == P2P for e in waiting.values()) and all(e.unsent == 0 for e in waiting.values()) \
            and all(e.moved == 0 for e in waiting.values()):
        return Diagnosis(kind=Kind.DEADLOCK, candidates=tuple(sorted(waiting)), reason=Reason.WAIT_FOR_EACH_OTHER,
                         certainty=Certainty.UNSURE, evidence=evidence, causes=CAUSES[Reason.WAIT_FOR_EACH_OTHER])
    if all(e.moved for e in waiting.values()):
        return Diagnosis(kind=Kind.SLOW, reason=Reason.LINK, evidence=evidence)
    return Diagnosis(kind=Kind.NETWORK_STALL, reason=Reason.LINK, evidence=evidence, causes=CAUSES[Reason.LINK])


def skipped_by_connections(s: Stall, named: Mapping[Who, Evidence]) -> Diagnosis | None:
    """Every rank waits in the same collective, at different lines, and no Flight Recorder says
    which group each is in: a line where only members of one subgroup wait (their connections
    show the group: meshes.shared_groups), while its other members wait at another line, with
    ranks outside it. Two calls of one group's collective would have met, whatever their lines;
    so the ones there wait in the subgroup's, and its members elsewhere never entered it. Likely,
    never certain: a member that called one more of the subgroup's collectives looks the same."""
    at: dict[str | None, set[Who]] = {}
    for key, e in named.items():
        at.setdefault(e.frame, set()).add(key)
    found = []
    for group in s.groups:
        if len(group) >= len(s.ranks):
            continue
        for frame, there in at.items():
            away = group - there
            if there < group and away and all(named[k].frame != frame for k in away if k in named) \
                    and all(k in named for k in away):
                found.append((group, frame, away))
    if len(found) != 1:
        return None
    group, _, away = found[0]
    return Diagnosis(kind=Kind.MISMATCH, culprits=tuple(sorted(away)), reason=Reason.SKIPPED_GROUP,
                     certainty=Certainty.LIKELY, evidence=s.evidence, causes=CAUSES[Reason.SKIPPED_GROUP],
                     group_ranks=tuple(sorted(k for k in group if isinstance(k, int))))


def _on_gpu(s: Stall, on_gpu: list[Who]) -> Diagnosis:
    """Ranks wait on GPUs that make no progress; the one behind, when the Flight Recorder shows the
    others completed a collective it never did."""
    waited = round(s.waited, 1) if s.waited is not None else None
    done = {r: s.ranks[r].completed for r in on_gpu}
    if len(on_gpu) > 1 and None not in done.values() and len(set(done.values())) > 1:
        lowest = min(v for v in done.values() if v is not None)
        behind = tuple(r for r in on_gpu if done[r] == lowest)
        return Diagnosis(kind=Kind.GPU_HANG, culprits=behind, reason=Reason.BEHIND, certainty=Certainty.LIKELY,
                         evidence=s.evidence, causes=CAUSES[Reason.WAITS_ON_GPU], waited=waited)
    return Diagnosis(kind=Kind.GPU_HANG, culprits=tuple(on_gpu), reason=Reason.WAITS_ON_GPU, evidence=s.evidence,
                     causes=CAUSES[Reason.WAITS_ON_GPU], waited=waited)


def _merged(first: Sequence[Evidence], rest: Sequence[Evidence]) -> tuple[Evidence, ...]:
    """The exits' evidence, then the live ranks' (one entry per rank)."""
    keys = {e.key for e in first}
    return tuple(first) + tuple(e for e in rest if e.key not in keys)


def _behind_of(waiting: Mapping[Who, Evidence], others: Mapping[Who, Evidence]) -> bool:
    """The Flight Recorder shows the others one collective (or more) behind the ranks that wait."""
    waits = {e.seq for e in waiting.values() if e.seq is not None}
    behind = [e.seq for e in others.values() if e.seq is not None]
    return bool(waits and behind) and max(behind) < min(waits)


def _odd_ones_out(where: Mapping[Who, object]) -> tuple[tuple[Who, ...], tuple[Who, ...]] | None:
    """(culprits, candidates) when the ranks are at more than one place: the ranks at the place
    fewest ranks are at; or, when two places hold as many ranks each (where they stand does not say
    which diverged), no culprit and the ranks of those places as candidates. None when every rank is
    at one place."""
    places: dict[object, list[Who]] = {}
    for r, place in where.items():
        places.setdefault(place, []).append(r)
    if len(places) < 2:
        return None
    fewest = min(len(rs) for rs in places.values())
    odd = [rs for rs in places.values() if len(rs) == fewest]
    if len(odd) > 1:
        return (), tuple(sorted(r for rs in odd for r in rs))
    return tuple(sorted(odd[0])), ()
