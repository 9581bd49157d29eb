"""The verdict rules for ranks (and torchruns) stuck in a rendezvous: who never checked in, as the
ranks' store says (never without it) and the node each belongs to; a waiting rank that never
registered; ranks that all checked in and still cannot connect; and torchruns that wait for the
other nodes' torchruns before any rank starts. Pure functions of the evidence (stalled.Stall, or
the torchruns seen), each deciding a verdict or passing (None); diagnose.py orders them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ddp_preflight.node.protocol import StoreAnswer

from .causes import CAUSES, DUPLICATE_NODE_RANK, LAUNCHERS_NEVER_CAME
from .model import Certainty, Diagnosis, Evidence, Kind, Reason
from .model import RankStatus as S
from .stalled import Stall, held_up_by
from .who import Who


def never_checked_in(s: Stall) -> Diagnosis | None:
    """Ranks wait in init_process_group, none in a collective and none unseen: who never checked in,
    as their store says since they began to wait. A rank's node is in its evidence; a rank no agent
    found is placed by the launch plan, or is on a node unknown."""
    ranks = s.ranks
    waiting = sorted(r for r, e in ranks.items() if e.state is S.RENDEZVOUS)
    if not waiting or s.waiting or s.unknown:
        return None
    store, evidence = s.store, s.evidence
    others = {r: e for r, e in ranks.items() if r not in waiting}
    busy = {r: e for r, e in s.busy.items() if r in others}
    if store is None or store.error or not store.checked_in or not store.world_size:
        # Who is missing cannot be told: say what is seen, and why the store did not say more.
        why = ("the store was not read" if store is None else
               f"the store at {store.master} could not be read ({store.error})" if store.error else
               f"the store at {store.master} holds no rank's check-in (with NCCL it never does)"
               if not store.checked_in else "the world size is unknown")
        if busy:
            return held_up_by(s, busy, evidence)
        if not others and (store is None or store.error):
            return _store_unanswered(ranks, waiting, store)
        if not others:
            return Diagnosis(kind=Kind.RENDEZVOUS_STALL, culprits=tuple(waiting), reason=Reason.CANNOT_CONNECT,
                             evidence=evidence, unknown_why=why, causes=CAUSES[Reason.CANNOT_CONNECT])
        return Diagnosis(kind=Kind.RENDEZVOUS_STALL, evidence=evidence, certainty=Certainty.UNSURE,
                         unknown_why=why + ", so who never checked in cannot be told")
    checked = set(store.checked_in)
    missing = [r for r in range(store.world_size) if r not in checked and r not in waiting]
    late = [r for r in waiting if r not in checked]      # waiting, yet not checked in
    if missing and all(r in busy for r in missing):
        return held_up_by(s, busy, evidence)
    if missing:
        unfound = tuple(Evidence(s.planned.get(r, ""), None, r, S.UNKNOWN, notes=("no agent found it",),
                                 unseen="no agent found it")
                        for r in missing if r not in ranks)
        marked = tuple(replace(e, reason=Reason.CANNOT_REACH_STORE) if e.key in late else e for e in evidence)
        return Diagnosis(kind=Kind.RENDEZVOUS_STALL, culprits=tuple(missing), reason=Reason.NEVER_CHECKED_IN,
                         certainty=Certainty.CERTAIN, evidence=marked + unfound, store=store.master,
                         causes=CAUSES[Reason.NEVER_CHECKED_IN])
    if late:
        return Diagnosis(kind=Kind.RENDEZVOUS_STALL, culprits=tuple(late), reason=Reason.CANNOT_REACH_STORE,
                         certainty=Certainty.CERTAIN, evidence=evidence, store=store.master,
                         causes=CAUSES[Reason.CANNOT_REACH_STORE])
    return Diagnosis(kind=Kind.RENDEZVOUS_STALL, culprits=tuple(waiting), reason=Reason.CANNOT_CONNECT,
                     certainty=Certainty.CERTAIN, evidence=evidence, store=store.master,
                     causes=CAUSES[Reason.CANNOT_CONNECT])


def _store_unanswered(ranks: Mapping[Who, Evidence], waiting: Sequence[Who], store: StoreAnswer | None) -> Diagnosis:
    """Every rank waits in init_process_group and their store gave no answer: where they stand
    cannot be told (a store that accepts and never answers, a store gone, or a process that only
    claims to be a rank and points at such a store). They are unknown, never culprits, and this
    is not a hang: nothing names them, writes a bundle or stops a run for them."""
    where = store.master if store is not None and store.master else "?"
    why = ("its store was not read" if store is None else
           f"no answer from its store at {where}" if store.silent else
           f"its store at {where} could not be read: {store.error}")
    said = f"waits in init_process_group; {why}"
    unknown = tuple(replace(e, state=S.UNKNOWN, reason=None, op=None, notes=(said,), unseen=said)
                    if r in waiting else e for r, e in sorted(ranks.items()))
    return Diagnosis(kind=Kind.UNSEEN, evidence=unknown, certainty=Certainty.UNSURE,
                     unknown_why="who is missing cannot be told without the store's answer")


# -- torchruns that wait for the other nodes' ----------------------------------------------------

@dataclass(frozen=True)
class Torchrun:
    """A torchrun of one run (one store), as its node's agent found it."""
    node: str
    pid: int
    node_rank: int | None            # its command line's
    nnodes: int | None               # the run's number of nodes, as its command line says


def torchruns_waiting(store: str, run: Sequence[Torchrun], watched: Sequence[str], waited: float) -> Diagnosis | None:
    """Torchruns of the run at `store` have started no rank and used no CPU for `waited` seconds:
    they wait in their rendezvous for the other nodes' torchruns. The node ranks that never checked
    in are those no torchrun of the run has; a watched node (`watched`) that runs none of them is
    where they were to be, when there are as many such nodes as node ranks missing. None when no
    node rank is missing (or the number of nodes is unknown)."""
    nnodes = max((t.nnodes or 0 for t in run), default=0)
    present = {t.node_rank for t in run if t.node_rank is not None}
    missing = sorted(set(range(nnodes)) - present)
    if not nnodes or not missing:
        return None
    claimed = [t.node_rank for t in run if t.node_rank is not None]
    twice = sorted({r for r in claimed if claimed.count(r) > 1})
    if twice:
        # Two torchruns of one run claim one node rank: the one missing never comes, whoever waits.
        evidence = tuple(Evidence(t.node, t.pid, None, S.RENDEZVOUS, node_rank=t.node_rank) for t in run)
        return Diagnosis(kind=Kind.RENDEZVOUS_STALL, reason=Reason.DUPLICATE_NODE_RANK, certainty=Certainty.CERTAIN,
                         evidence=evidence, nodes=tuple(sorted({t.node for t in run if t.node_rank in twice})),
                         node_ranks=tuple(missing), store=store, world=nnodes, waited=round(waited, 1),
                         causes=DUPLICATE_NODE_RANK)
    hosts = {t.node for t in run}
    absent = [name for name in watched if name not in hosts]
    named = tuple(absent) if len(absent) == len(missing) else ()
    evidence = tuple(Evidence(t.node, t.pid, None, S.RENDEZVOUS, node_rank=t.node_rank) for t in run)
    return Diagnosis(kind=Kind.RENDEZVOUS_STALL, reason=Reason.NEVER_CHECKED_IN,
                     certainty=Certainty.LIKELY if named else Certainty.UNSURE, evidence=evidence, nodes=named,
                     node_ranks=tuple(missing), store=store, world=nnodes, waited=round(waited, 1),
                     causes=LAUNCHERS_NEVER_CAME)
