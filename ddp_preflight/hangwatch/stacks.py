"""Every rank's stack at once: ranks with the same stack grouped, so 64 ranks read as the few places
they are, with the ranks outside the largest group marked as the ones that differ; and, once a hang
is named and the Flight Recorder's sequence numbers are known, where each rank is in the sequence
of collectives (sequence.join). Pure, over a snapshot: the dashboard renders it (words.ranks_of,
ended_text.joined)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from . import sequence
from .model import Diagnosis, RankView, Unnumbered, Who
from .sequence import Entered, Joined


@dataclass(frozen=True)
class StackGroup:
    """Ranks whose stacks are the same, frame for frame (file, line, function; innermost first)."""
    stack: list[dict] | None               # as RankView.stack holds it; None: no stack taken yet for these ranks
    ranks: tuple[Who, ...]                 # by rank; a rank whose number is unknown by its pid (Unnumbered)
    differs: bool                          # a stack, and not the most ranks' one


@dataclass(frozen=True)
class StacksView:
    groups: tuple[StackGroup, ...]         # the largest group first; the ranks without a stack last
    joined: Joined[Entered] | None         # the ranks by sequence number, when a hang is named and known
    ranks: int                             # how many ranks in all


def _key(rank: RankView) -> Who:
    return rank.rank if rank.rank is not None else Unnumbered(rank.node, rank.pid)


RAW_ADDRESS = re.compile(r"^(0x)?[0-9a-fA-F]{6,}$")     # a native frame py-spy could not name: "0x7f875b6a3f16"


def _frames(stack: list[dict]) -> tuple[tuple[str, str, str], ...]:
    """What makes two stacks the same: what the rank does, innermost first: each Python frame's
    file, line and function, and each named native function. A native frame py-spy could not name
    is an address, different in every process (where its libraries were loaded): it says nothing
    of what the rank does, and would split ranks that wait at the same line."""
    return tuple((str(f.get("file", "?")), str(f.get("line", "?")), str(f.get("function", "?"))) for f in stack
                 if not RAW_ADDRESS.match(str(f.get("function", ""))))


def group_stacks(ranks: Sequence[RankView]) -> tuple[StackGroup, ...]:
    """The ranks grouped by identical stack, the largest group first (a tie: the group with the
    lowest rank first). The groups outside the largest differ; with one stack for all, none does.
    Ranks without a stack form one last group, never marked: where they are is not known."""
    by_stack: dict[tuple, tuple[list[dict], list[Who]]] = {}
    unknown: list[Who] = []
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


def _order(key: Who) -> tuple[bool, int]:
    return (False, key) if isinstance(key, int) else (True, key.pid or 0)   # numbered ranks first, then the pids


def joined(diagnosis: Diagnosis | None) -> Joined[Entered] | None:
    """Where the ranks are in the sequence of collectives, when a hang is named and at least two
    ranks' sequence numbers are known (the verdict's evidence: its Flight Recorder)."""
    if diagnosis is None or not diagnosis.kind.is_hang:
        return None
    return sequence.join(sequence.entered_from(diagnosis.evidence))


def stacks_view(ranks: Sequence[RankView], diagnosis: Diagnosis | None) -> StacksView:
    return StacksView(group_stacks(ranks), joined(diagnosis), len(ranks))
