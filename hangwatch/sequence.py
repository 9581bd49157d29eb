"""The ranks' collectives lined up by sequence number (the Flight Recorder, NCCL's watchdog): the
highest collective any rank entered, the ranks that issued it and the ranks that never entered it.
Pure. One join for every view of it: `explain` over the dumps a run left (explain/join.py reads
them into `Entered`), hangwatch's verdict text and the dashboard over a verdict's evidence."""

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
