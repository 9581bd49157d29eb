"""How the ranks of a run ended, as its files show it, judged by the rule the live watcher and a
launch's summary use (hangwatch/exits.py): each rank's end (its exception, its exit code or
signal, who stopped it) becomes an exits.Ending, and exits.judge names the ending no other
explains. Logs carry no exit times: ends are ordered only where the files say more."""

from __future__ import annotations

from collections.abc import Sequence

from ddp_preflight.hangwatch import exits, named
from ddp_preflight.hangwatch.ended import as_seen
from ddp_preflight.hangwatch.failures import Failure
from ddp_preflight.hangwatch.model import Basis, Certainty, Evidence, Reason
from ddp_preflight.hangwatch.model import RankStatus as S
from ddp_preflight.hangwatch.who import Unnumbered
from ddp_preflight.hangwatch.words import who

from .root import Root, quotes
from .seen import Gathered, NodeSaid, RankSeen


def ending_of(seen: RankSeen, ooms: Sequence[NodeSaid] = ()) -> exits.Ending:
    """A rank's end as the one judge takes it; `ooms`: the kernel's OOM-killer lines the files hold
    (ooms_of), which say what the live agent's OOM-kill count says (Ending.oom)."""
    key = seen.key
    exception = as_seen(seen.exception, seen.source) if seen.exception is not None else None
    lines = seen.quotes or seen.exit_quotes
    return exits.Ending(seen.node or "", seen.pid, seen.rank, status=seen.exit, exception=exception,
                        quote=lines[0].text if lines else None, stopped_by=seen.stopped_by,
                        writer=key.writer if isinstance(key, Unnumbered) else None,
                        oom=any(_killed(seen, n) for n in ooms) or None)


def ooms_of(g: Gathered) -> list[NodeSaid]:
    """The kernel's OOM-killer lines read (dmesg, Slurm's): 'Out of memory: Killed process PID'."""
    return [n for n in g.nodes if n.said.failure is Failure.OOM_KILLED]


def _killed(seen: RankSeen, line: NodeSaid) -> bool:
    """The OOM killer's line is about this rank: it names the rank's process, or, where either
    process id is unknown, it is its node's line (or a line of no node)."""
    pid = line.said.detail.get("pid")
    if pid is not None and seen.pid is not None:
        return pid == seen.pid
    return line.node is None or line.node == seen.node


def ended(g: Gathered) -> list[RankSeen]:
    """The ranks the files say ended: an exit, or an exception that ended the rank."""
    return [r for r in g.ranks if r.exit is not None or r.exception is not None]


def reads(g: Gathered) -> dict:
    """What each rank's end was (exits.read: its own failure, a lost peer's, a launcher's stop), by key."""
    endings = [ending_of(r, ooms_of(g)) for r in ended(g)]
    return {e.key: exits.read(e, endings) for e in endings}


def judged(g: Gathered) -> Root | None:
    """The rank whose end no other explains, as exits.judge says; None when nothing failed."""
    done = ended(g)
    if not done:
        return None
    world = g.world or _world_seen(g)
    seen = {r.rank for r in done if r.rank is not None}
    unseen = [_unseen(g, rank) for rank in range(world or 0) if rank not in seen]
    found = exits.judge([ending_of(r, ooms_of(g)) for r in done], unseen=unseen)
    if found is None:
        return None
    evidence = {e.key: e for e in found.evidence}
    lost = [r for r in done if r.exception is not None and r.exception.lost_peer]
    named = [r for r in done if r.key in found.named]
    root = Root(found.kind, found.reason or Reason.LOST_PEER, list(found.culprits), list(found.candidates),
                found.certainty, notes={k: e.notes for k, e in evidence.items() if e.notes},
                named_by={k: e.named_by for k, e in evidence.items() if e.named_by},
                reasons={k: e.reason for k, e in evidence.items() if e.reason is not None},
                quotes=(quotes(ooms_of(g)) if found.reason is Reason.OOM_KILLED else []) + quotes(named)
                + [q for r in named if not r.quotes for q in r.exit_quotes[:1]],
                named_by_words=found.reason in (Reason.LEFT_FIRST, Reason.LOST_PEER) and not named,
                extra=tuple(e for e in found.evidence if e.key in found.named and e.key not in {r.key for r in done}))
    if g.twice and root.certainty is Certainty.CERTAIN:
        # the ends of two runs (or two attempts) in one paste: whose end came first is not one run's order
        twice = ",".join(map(str, sorted(g.twice)))
        root.candidates, root.culprits, root.certainty = [*root.culprits, *root.candidates], [], Certainty.UNSURE
        root.unknown_why = f"the paste holds two ends of rank{'s' if len(g.twice) > 1 else ''} {twice} (another " \
                           f"process each time): two runs or attempts, whose ends are not one run's order; paste one"
    if root.reason is Reason.LEFT_FIRST and not named:
        one = len(found.named) == 1
        root.quotes = quotes(lost[:2])
        root.unknown_why = f"{who(r.key for r in lost)} lost {'it' if one else 'one of them'}"
    elif not found.named:
        root.quotes = quotes(lost[:2])
        root.nodes = sorted({r.node for r in lost if r.node})
        root.unknown_why = f"{who(r.key for r in lost)} lost a peer or the link"
    return root


def context(g: Gathered) -> named.Context:
    """What the files know of the run beyond its ends: its nodes in order (a launch's plan) and
    whether ddp-preflight --launch ran it."""
    return named.Context(g.node_order[0] if g.node_order else None, tuple(g.node_order), g.launched)


def from_named(g: Gathered, found: named.Named | None) -> Root | None:
    """The one judge's verdict from the ranks' words, with the lines of the ranks whose words decided it."""
    if found is None:
        return None
    d = found.diagnosis
    said = [r for r in g.ranks if r.key in found.said_by]
    launchers = [n for n in g.nodes if any(n.said is said.said for said in found.launchers)]
    return Root(d.kind, d.reason or Reason.FAILED, list(d.culprits), list(d.candidates), d.certainty,
                nodes=list(d.nodes), store=d.store, unknown_why=d.unknown_why,
                notes={e.key: tuple(e.notes) for e in d.evidence if e.notes},
                named_by={e.key: e.named_by for e in d.evidence if e.named_by},
                quotes=quotes(launchers) + quotes(said), fix=found.fix, named_by_words=d.basis is Basis.WORDS)


def _unseen(g: Gathered, rank: int) -> Evidence:
    """A rank of the run whose end no file shows (a rank that exits 0 is in no table)."""
    return Evidence(g.node_of(rank) or "", None, rank, S.UNKNOWN)


def _world_seen(g: Gathered) -> int | None:
    ranks = [r.rank for r in g.ranks if r.rank is not None]
    return max(ranks) + 1 if ranks else None
