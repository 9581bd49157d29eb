"""How each launched rank ended, as the launcher saw it (torchrun's exit code or signal, the
exception its output shows, who began stopping it), judged by the one rule of who failed first
(hangwatch/exits.py's judge): the rule the live watcher and `ddp-preflight explain` use. A watched
launch has hangwatch's verdict, from more evidence (the exits on one clock, each rank's own
record); this is the launcher's word where there is none, and which rank of a node torchrun
stopped the others for."""

from __future__ import annotations

from collections.abc import Sequence

from ddp_preflight.hangwatch import exits, named
from ddp_preflight.hangwatch.ended import as_seen
from ddp_preflight.hangwatch.model import Diagnosis
from ddp_preflight.hangwatch.who import Who

from .launched import LaunchedRank, LaunchResult, NodeState


def stopped_by_us(rank: LaunchedRank, node: NodeState | None) -> bool:
    """ddp-preflight's stop ended it (exits.stop_of, the one rule)."""
    return stopped_by(rank, node) is exits.OUTSIDE


def stopped_by(rank: LaunchedRank, node: NodeState | None) -> exits.StoppedBy | None:
    """Who began stopping it before it ended: exits.stop_of over what the launch recorded of it."""
    return exits.stop_of(rank.status, node is not None and node.stopped, rank.error_after_stop, rank.failed_first,
                         rank.stopped_by is exits.StoppedBy.TORCHRUN)


def ending_of(rank: LaunchedRank, node: NodeState | None) -> exits.Ending:
    error = rank.error
    return exits.Ending(rank.node, rank.pid, rank.rank, status=rank.status,
                        exception=as_seen(error, "output") if error is not None else None,
                        quote=error.quote[0] if error is not None and error.quote else None,
                        stopped_by=stopped_by(rank, node))


def judge(ranks: Sequence[LaunchedRank], nodes: Sequence[NodeState]) -> Diagnosis | None:
    """The verdict on these ranks' ends (None: nothing failed, or the run was stopped first)."""
    by = {n.node: n for n in nodes}
    endings = [ending_of(r, by.get(r.node)) for r in ranks if r.ended]
    master = next((r.node for r in ranks if r.rank == 0), None)
    order = tuple(dict.fromkeys(r.node for r in sorted(ranks, key=lambda r: r.rank)))
    launchers = [named.LauncherSaid(n.node, said) for n in nodes for said in n.said]
    if not endings and not launchers:
        return None
    return named.judge(endings, context=named.Context(master, order, launched=True), launchers=launchers)


def by_launchers(nodes: Sequence[NodeState]) -> Diagnosis | None:
    """What the torchruns' own lines named (their parser, their store's port, their rendezvous), by
    the one judge's rule: where no rank started, the only word on the run."""
    found = named.by_launchers([named.LauncherSaid(n.node, said) for n in nodes for said in n.said])
    return found.diagnosis if found is not None else None


def first_on_node(ranks: Sequence[LaunchedRank], node: NodeState) -> tuple[Who, ...]:
    """The rank (or the ranks that cannot be told apart) of this node whose end made torchrun stop
    the others: the one rule, over the node's own ends."""
    found = judge(ranks, [node])
    return found.named if found is not None else ()


def judged(result: LaunchResult) -> Diagnosis | None:
    """The run's verdict: the one it holds (hangwatch's, or the launcher's once the run ended);
    a result that holds none and was never judged is judged here, by the same rule."""
    if result.verdict is not None or result.judged:
        return result.verdict
    return judge(result.ranks, result.nodes)
