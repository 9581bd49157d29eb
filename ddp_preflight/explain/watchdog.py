"""NCCL's watchdog lines of several ranks lined up by process group: ranks at one SeqNum of one
group in different ops issued different collectives; a rank at a lower SeqNum of the same group
than the others is behind them; every rank at one op says no more than that one of them never
came (the Flight Recorder says who). Sequence numbers of different groups are never compared: a
line that names no group (torch before 2.4) is lined up with others only to see two ops at one
SeqNum, and only where the paste names a single group."""

from __future__ import annotations

from dataclasses import dataclass, field

from ddp_preflight.rules.failures import PROCESS_GROUP

from .messages import Hit


@dataclass
class Lined:
    mismatch: bool = False
    behind: tuple[int, ...] = ()
    detail: dict = field(default_factory=dict)
    hits: list[Hit] = field(default_factory=list)      # the lines that decide it


@dataclass(frozen=True)
class _At:
    seq: int
    op: str
    hit: Hit
    named: bool          # its group is named (on its line, or its status line at the same SeqNum)


def _group(hit: Hit) -> str | None:
    found = PROCESS_GROUP.search(hit.line.text)
    return found["pg"] if found else None


def _timed_out(hits: list[Hit]) -> dict[tuple[str | None, int], _At]:
    """(group, rank) -> where that rank timed out; the group None where no line names it."""
    groups: dict[tuple[int, int], str] = {}
    for hit in hits:
        group = _group(hit)
        if hit.message.id == "watchdog-status" and hit.line.rank is not None and group is not None:
            groups[(hit.line.rank, int(hit.found.groups["seq"]))] = group
    at: dict[tuple[str | None, int], _At] = {}
    for hit in hits:
        said = hit.found.groups
        seq, op = said.get("seq") or said.get("seq2"), said.get("op") or said.get("op2")
        if hit.message.id != "watchdog" or hit.line.rank is None or seq is None or op is None:
            continue
        group = _group(hit) or groups.get((hit.line.rank, int(seq)))
        at.setdefault((group, hit.line.rank), _At(int(seq), op, hit, group is not None))
    return at


def by_groups(hits: list[Hit]) -> Lined:
    at = _timed_out(hits)
    named = sorted({g for g, _ in at if g is not None})
    lined = Lined(detail={"groups": named})
    for group in named:
        ranks = {r: a for (g, r), a in at.items() if g == group}
        # two ops at one SeqNum: the unnamed lines count too when the paste names this group alone
        with_unnamed = dict(ranks)
        if len(named) == 1:
            with_unnamed.update({r: a for (g, r), a in at.items() if g is None and r not in ranks})
        ops: dict[int, set[str]] = {}
        for a in with_unnamed.values():
            ops.setdefault(a.seq, set()).add(a.op)
        if any(len(o) > 1 for o in ops.values()):
            lined.mismatch = True
            lined.hits = [a.hit for a in with_unnamed.values()]
            lined.detail.update(group=group, ops={str(r): f"#{a.seq} {a.op}" for r, a in sorted(with_unnamed.items())})
            return lined
        seqs = {a.seq for a in ranks.values()}
        if len(ranks) >= 2 and len(seqs) > 1 and not lined.behind:
            lowest = min(seqs)
            lined.behind = tuple(sorted(r for r, a in ranks.items() if a.seq == lowest))
            lined.hits = [a.hit for a in ranks.values()]
            lined.detail.update(group=group, seqs={str(r): a.seq for r, a in sorted(ranks.items())})
    return lined
