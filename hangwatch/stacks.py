"""Every rank's stack at once: ranks with the same stack grouped, so 64 ranks read as the few places
they are, with the ranks outside the largest group marked as the ones that differ; and, once a hang
is named and the Flight Recorder's sequence numbers are known, where each rank is in the sequence
of collectives (sequence.join). Pure, over a snapshot: the dashboard renders it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from . import sequence, text
from .model import Diagnosis, RankView


@dataclass(frozen=True)
class StackGroup:
    """Ranks whose stacks are the same, frame for frame (file, line, function; innermost first)."""
    stack: list[dict] | None               # as RankView.stack holds it; None: no stack taken yet for these ranks
    ranks: tuple[int, ...]                 # by rank; a rank whose number is unknown is its negated pid
    differs: bool                          # a stack, and not the most ranks' one

    @property
    def who(self) -> str:
        """"ranks 0-31,33-63", "rank 32", "pid 4242"."""
        numbered = [r for r in self.ranks if r >= 0]
        pids = sorted(-r for r in self.ranks if r < 0)
        parts = [text.ranks(numbered)] if numbered else []
        parts += [("pid " if len(pids) == 1 else "pids ") + ",".join(map(str, pids))] if pids else []
        return " and ".join(parts)


@dataclass(frozen=True)
class StacksView:
    groups: tuple[StackGroup, ...]         # the largest group first; the ranks without a stack last
    joined: str | None                     # the ranks by sequence number, when a hang is named and known
    ranks: int                             # how many ranks in all


def _key(rank: RankView) -> int:
    return rank.rank if rank.rank is not None else -rank.pid


def _frames(stack: list[dict]) -> tuple[tuple[str, str, str], ...]:
    """What makes two stacks the same: each frame's file, line and function, innermost first."""
    return tuple((str(f.get("file", "?")), str(f.get("line", "?")), str(f.get("function", "?"))) for f in stack)


def group_stacks(ranks: Sequence[RankView]) -> tuple[StackGroup, ...]:
    """The ranks grouped by identical stack, the largest group first (a tie: the group with the
    lowest rank first). The groups outside the largest differ; with one stack for all, none does.
    Ranks without a stack form one last group, never marked: where they are is not known."""
    by_stack: dict[tuple, tuple[list[dict], list[int]]] = {}
    unknown: list[int] = []
    for rank in ranks:
        if rank.stack is None:
            unknown.append(_key(rank))
        else:
            by_stack.setdefault(_frames(rank.stack), (rank.stack, []))[1].append(_key(rank))
    ordered = sorted(by_stack.values(), key=lambda item: (-len(item[1]), _order(min(item[1], key=_order))))
    groups = [StackGroup(stack, tuple(sorted(keys, key=_order)), differs=i > 0) for i, (stack, keys) in
              enumerate(ordered)]
    if unknown:
        groups.append(StackGroup(None, tuple(sorted(unknown, key=_order)), differs=False))
    return tuple(groups)


def _order(key: int) -> tuple[bool, int]:
    return (key < 0, abs(key))             # numbered ranks first, then the pids


def joined(diagnosis: Diagnosis | None) -> str | None:
    """Where the ranks are in the sequence of collectives, in words, when a hang is named and at
    least two ranks' sequence numbers are known (the verdict's evidence: its Flight Recorder)."""
    if diagnosis is None or not diagnosis.kind.is_hang:
        return None
    found = sequence.join(sequence.entered_from(diagnosis.evidence))
    return text.joined(found) if found is not None else None


def stacks_view(ranks: Sequence[RankView], diagnosis: Diagnosis | None) -> StacksView:
    return StacksView(group_stacks(ranks), joined(diagnosis), len(ranks))
