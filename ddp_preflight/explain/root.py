"""The root a rule of explain found, before it becomes a verdict: what kind, whom it names and why,
the lines it rests on and the fix. Plain data shared by the rules (words.py, ended.py) and the
verdict (verdict.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ddp_preflight.hangwatch.model import Certainty, Evidence, Kind, Reason
from ddp_preflight.hangwatch.who import Who
from ddp_preflight.rules.fix import Fix

from .seen import NodeSaid, Quote, RankSeen

QUOTES = 8          # lines quoted at most


@dataclass
class Root:
    kind: Kind
    reason: Reason
    culprits: list[Who] = field(default_factory=list)
    candidates: list[Who] = field(default_factory=list)
    certainty: Certainty = Certainty.CERTAIN
    nodes: list[str] = field(default_factory=list)
    store: str | None = None
    unknown_why: str | None = None
    notes: Mapping[Who, tuple[str, ...]] = field(default_factory=dict)   # what says so, per rank (Evidence.notes)
    named_by: Mapping[Who, str] = field(default_factory=dict)   # what gave each rank its reason (Evidence.named_by)
    reasons: dict[Who, Reason] = field(default_factory=dict)   # each rank's own reason, where the rule said it
    quotes: list[Quote] = field(default_factory=list)
    fix: Fix | None = None
    named_by_words: bool = True                             # text.named renders it
    extra: tuple[Evidence, ...] = ()                        # ranks it names that no file shows


def quotes(items: Iterable[RankSeen | NodeSaid]) -> list[Quote]:
    """The lines these ranks' (or launchers') failures rest on, ranks in order, at most QUOTES."""
    out: list[Quote] = []
    for item in sorted(items, key=_order):
        for quote in item.quotes:
            if quote not in out:
                out.append(quote)
        if len(out) >= QUOTES:
            break
    return out


def _order(item: RankSeen | NodeSaid) -> tuple[bool, int]:
    rank = item.rank if isinstance(item, RankSeen) else None
    return (rank is None, rank or 0)
