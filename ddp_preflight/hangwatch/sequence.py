"""The ranks' collectives lined up by sequence number (the Flight Recorder, NCCL's watchdog): the
highest collective any rank entered, the ranks that issued it and the ranks that never entered it.
Pure. One join for every view of it: `explain` over the dumps a run left (explain/join.py reads
them into `Entered`), hangwatch's verdict text and the dashboard over a verdict's evidence.

Sequence numbers count per process group: `join` lines up the default group's; `by_group` each
group alone; `skipped_in_group` names, across groups, the subgroup's member that never entered
the collective its other members wait in. Numbers of two groups are never compared."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from .model import Evidence


@dataclass(frozen=True)
class Entered:
    """Where one rank is in its default group's sequence of collectives."""
    rank: int
    seq: int                     # the last collective it entered
    op: str | None               # "all_reduce"
    completed: int | None        # the last one it saw complete
    frame: str | None            # the training's own line that issued it, or where the rank was: "train.py:88"


E = TypeVar("E", bound=Entered)


@dataclass(frozen=True)
class Joined(Generic[E]):
    entered: tuple[E, ...]       # every rank with a number, by rank
    behind: tuple[int, ...]      # ranks that never entered the highest collective the others issued
    ahead: tuple[int, ...]       # ranks that issued it
    seq: int | None              # that collective
    op: str | None
    frame: str | None            # where the ranks ahead issued it


def join(entered: Iterable[E]) -> Joined[E] | None:
    """The ranks lined up; None with fewer than two ranks numbered (nothing to line up)."""
    entered = list(entered)
    if len(entered) < 2:
        return None
    top = max(e.seq for e in entered)
    ahead = [e for e in entered if e.seq == top]
    behind = tuple(sorted(e.rank for e in entered if e.seq < top))
    frame = next((e.frame for e in ahead if e.frame), None)
    return Joined(tuple(sorted(entered, key=lambda e: e.rank)), behind, tuple(sorted(e.rank for e in ahead)),
                  top, ahead[0].op, frame)


def entered_from(evidence: Iterable[Evidence]) -> list[Entered]:
    """A verdict's ranks as it saw them, those with a rank and a sequence number."""
    return [Entered(e.rank, e.seq, e.seq_op, e.completed, e.frame) for e in evidence
            if e.rank is not None and e.seq is not None]


# -- per process group ----------------------------------------------------------------------------
# Sequence numbers count per process group: all_reduce #7 of a subgroup (new_group([0, 1])) and
# all_reduce #12 of the default group are not one sequence. Each group is lined up alone, among
# the ranks that have used it (or that its Flight Recorder lists, NCCL's).

DEFAULT = ("0", "default_pg")       # the default (world) group: torch's id, and its description


@dataclass(frozen=True)
class InGroupJoined:
    """One process group's collectives lined up."""
    group: str                       # its id ("1": the first new_group)
    members: tuple[int, ...]         # the ranks seen in it
    seq: int                         # the highest collective of it any rank entered
    op: str | None
    ahead: tuple[int, ...]           # ranks that entered it
    behind: tuple[int, ...]          # members that never did
    waiting: tuple[int, ...]         # ranks whose last collective of all is it: they wait in it

    @property
    def default(self) -> bool:
        return self.group in DEFAULT


def by_group(evidence: Iterable[Evidence]) -> dict[str, InGroupJoined]:
    """Every process group the ranks' Flight Recorders show, lined up alone."""
    places: dict[str, dict[int, tuple[int, str | None, bool]]] = {}
    listed: dict[str, set[int]] = {}
    for e in evidence:
        if e.rank is None:
            continue
        for g in e.groups:
            places.setdefault(g.group, {})[e.rank] = (g.seq, g.op, g.last)
            listed.setdefault(g.group, set()).update(g.ranks)
    found = {}
    for group, at in places.items():
        members = tuple(sorted(set(at) | listed.get(group, set())))
        top = max(seq for seq, _, _ in at.values())
        ahead = tuple(sorted(r for r, (seq, _, _) in at.items() if seq == top))
        op = next(o for r, (seq, o, _) in sorted(at.items()) if seq == top)
        found[group] = InGroupJoined(group, members, top, op, ahead,
                                     tuple(r for r in members if r not in ahead),
                                     tuple(r for r in ahead if at[r][2]))
    return found


def waits_in(e: Evidence) -> str | None:
    """The group whose collective the rank waits in: that of its last collective of all."""
    return next((g.group for g in e.groups if g.last), None)


def skipped_in_group(evidence: Iterable[Evidence]) -> InGroupJoined | None:
    """The subgroup whose collective some of its members never entered while others of it wait
    there, the members that never entered it waiting in another group's collective: those members
    skipped it (or the ranks waiting there called one more: the numbers cannot tell the two apart,
    which is why a verdict from this is never certain). Where several subgroups are so, the
    smallest (a subgroup's collective is the one rank-dependent code skips); None where none is,
    or two as small are."""
    evidence = [e for e in evidence if e.rank is not None]
    if len(evidence) < 2 or not all(e.groups for e in evidence):
        return None
    where = {e.rank: waits_in(e) for e in evidence}
    blocked = [j for j in by_group(evidence).values()
               if not j.default and j.waiting and j.behind and len(j.members) > 1
               and all(where.get(r) not in (None, j.group) for r in j.behind)]
    if not blocked:
        return None
    smallest = min(len(j.members) for j in blocked)
    fewest = [j for j in blocked if len(j.members) == smallest]
    return fewest[0] if len(fewest) == 1 else None


def across_groups(evidence: Iterable[Evidence]) -> bool:
    """Ranks wait in collectives of different process groups: their default group's numbers say
    nothing of who is behind (a rank waiting in a subgroup's collective has not reached the
    default group's next one)."""
    return len({w for e in evidence if (w := waits_in(e)) is not None}) > 1
