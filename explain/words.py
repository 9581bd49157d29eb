"""What the failures' own words name (hangwatch/failures.py, the one catalogue): a launcher's
(torchrun's parser, its store's port, its rendezvous), then a rank's, decided by the one judge's
first step (hangwatch/named.py: the address family, a refused connection, NCCL, CUDA's memory,
what the backend does not implement, a collective's timeout; the live watcher uses it too), then
what only the files hold (the OOM killer's lines, NCCL's watchdog lines), and where the ranks'
Flight Recorders say one is behind. Each rule decides or passes; the fix is preflight's own (rules/)."""

from __future__ import annotations

import signal

from hangwatch import named
from hangwatch.failures import Failure
from hangwatch.model import Certainty, Kind, Reason
from rules.launch_args import separate
from rules.ports import who_holds

from .ended import context, ended, ending_of, from_named
from .join import Joined, join
from .root import Root, quotes
from .seen import Gathered, NodeSaid, RankSeen


def named_by_words(g: Gathered) -> Root | None:
    """The first root a failure's words name, in the order a run fails in: its launcher, then its ranks."""
    return launcher(g) or said(g) or behind(g)


def launcher(g: Gathered) -> Root | None:
    """What a launcher's own lines name: torchrun's parser, its store's port."""
    for failure, reason in ((Failure.SCRIPT_OPTIONS, Reason.SCRIPT_OPTIONS), (Failure.PORT_IN_USE, Reason.PORT_IN_USE)):
        said = [n for n in g.nodes if n.said.failure is failure]
        if not said:
            continue
        nodes = sorted({n.node for n in said if n.node})
        first = said[0]
        if reason is Reason.SCRIPT_OPTIONS:
            option = first.said.detail.get("option")
            return Root(Kind.EXITED, reason, nodes=nodes, unknown_why=first.said.detail.get("what"),
                        quotes=quotes(said), fix=separate(["SCRIPT", option] if option else ["SCRIPT"], "SCRIPT"))
        port = first.said.detail.get("port")
        return Root(Kind.EXITED, reason, nodes=nodes, store=str(port) if port else None, quotes=quotes(said),
                    fix=who_holds(nodes[0] if nodes else "the master", port or "MASTER_PORT"))
    rendezvous = [n for n in g.nodes if n.said.failure is Failure.RENDEZVOUS_TIMEOUT]
    if rendezvous:
        return _rendezvous(g, rendezvous, [])
    return None


def said(g: Gathered) -> Root | None:
    """What the ranks' own exceptions name, by the one judge's first step (hangwatch/named.py, the
    live watcher's too); then what only the files hold: the kernel's OOM killer (dmesg lines), NCCL's
    watchdog lines; a collective's timeout yields to the Flight Recorders' word on who is behind."""
    words = from_named(g, named.by_words([ending_of(r) for r in ended(g)], context=context(g)))
    if words is not None and words.reason not in (Reason.TIMED_OUT, Reason.BEHIND):
        return words
    ooms = [n for n in g.nodes if n.said.failure is Failure.OOM_KILLED]
    killed = [r for r in g.ranks if r.exit is not None and r.exit.signal == signal.SIGKILL]
    if ooms and killed:
        return Root(Kind.EXITED, Reason.OOM_KILLED, culprits=sorted(r.key for r in killed),
                    notes={r.key: ("signal 9, SIGKILL",) for r in killed},
                    quotes=quotes(ooms) + [q for r in killed for q in r.exit_quotes[:1]])
    if _behind_ranks(g):
        return None
    watched = [r for r in g.ranks if r.watchdog is not None]
    if watched:
        alone = len({r.rank for r in g.ranks if r.rank is not None}) < 2
        return Root(Kind.NETWORK_STALL, Reason.TIMED_OUT, culprits=sorted(r.key for r in watched),
                    certainty=Certainty.LIKELY, quotes=[q for r in watched for q in r.watchdog_quotes[:2]],
                    unknown_why="only its output was read: the other ranks' logs or Flight Recorder dumps say "
                                "which rank is behind" if alone else None)
    return words


def _rendezvous(g: Gathered, said: list[NodeSaid], ranks: list[RankSeen]) -> Root:
    details = [n.said.detail for n in said] + [r.said.detail for r in ranks if r.said]
    store = next((d["store"] for d in details if d.get("store")), None)
    waited = next((d for d in details if d.get("side") == "store"), None)
    client_nodes = sorted({n.node for n in said if n.node and n.said.detail.get("side") == "client"} |
                          {r.node for r in ranks if r.node and r.said and r.said.detail.get("side") == "client"})
    said_quotes = quotes(said) + quotes(ranks)
    waiting = (f"the store waited {waited['seconds']} s and {waited['joined']} of {waited['world']} torchruns joined"
               if waited else None)
    if client_nodes:
        said_by_client = next((d["said"] for d in details if d.get("said")), "it timed out")
        return Root(Kind.RENDEZVOUS_STALL, Reason.CANNOT_REACH_STORE, nodes=client_nodes, store=store,
                    culprits=sorted(r.key for r in ranks), quotes=said_quotes,
                    unknown_why=said_by_client + (f"; {waiting}" if waiting else ""))
    return Root(Kind.RENDEZVOUS_STALL, Reason.NEVER_CHECKED_IN, certainty=Certainty.UNSURE, store=store,
                nodes=sorted({n.node for n in said if n.node}), unknown_why=waiting or "the rendezvous timed out",
                quotes=said_quotes)


def _behind_ranks(g: Gathered) -> Joined | None:
    """The ranks the Flight Recorders say are behind; none in a watched launch a person stopped
    (Gathered.watched_no_hang: dumps kept while the ranks ran)."""
    if g.watched_no_hang:
        return None
    joined = join(g.ranks, g.world)
    return joined if joined is not None and joined.behind else None


def behind(g: Gathered) -> Root | None:
    joined = _behind_ranks(g)
    if joined is None:
        return None
    lines = [e.quote for e in joined.entered if e.rank in joined.behind] + \
        [e.quote for e in joined.entered if e.rank in joined.ahead][:3]
    return Root(Kind.DEADLOCK, Reason.BEHIND, culprits=list(joined.behind), quotes=lines, named_by_words=False)
