"""What the failures' own words name (hangwatch/failures.py, the one catalogue): a launcher's
(torchrun's parser, its store's port, its rendezvous), then a rank's (the address family, a
refused connection, NCCL, CUDA's memory, what the backend does not implement, the OOM killer,
a collective's timeout), and where the ranks' Flight Recorders say one is behind. Each rule
decides or passes; the fix is preflight's own (rules/)."""

from __future__ import annotations

import signal

from hangwatch.failures import Failure, family_name
from hangwatch.model import Certainty, Kind, Reason
from hangwatch.words import who
from rules.collectives import workaround
from rules.fix import Action, Fix, run
from rules.launch_args import separate
from rules.ports import who_holds
from rules.routes import ifname_var, pin_interface

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
    """What the ranks' own exceptions name."""
    by: dict[Failure, list[RankSeen]] = {}
    for seen in g.ranks:
        if seen.said is not None:
            by.setdefault(seen.said.failure, []).append(seen)
    if Failure.ADDRESS_FAMILY in by:
        return _address_family(g, by[Failure.ADDRESS_FAMILY])
    if Failure.CANNOT_CONNECT in by:
        ranks = by[Failure.CANNOT_CONNECT]
        peers = sorted({r.said.detail["peer"] for r in ranks if r.said and r.said.detail.get("peer")})
        why = {r.said.detail.get("why") for r in ranks if r.said}
        nodes = sorted({r.node for r in g.ranks if r.node})
        return Root(Kind.RENDEZVOUS_STALL, Reason.CANNOT_CONNECT, nodes=nodes, certainty=Certainty.CERTAIN,
                    unknown_why=(f"Gloo's connectFullMesh failed on {who(r.key for r in ranks)} "
                                 f"({', '.join(sorted({r.node for r in ranks if r.node}))}): "
                                 f"{' / '.join(sorted(w for w in why if w))}"
                                 + (f" connecting to {', '.join(peers)}: {_hosts(peers)} must accept new TCP "
                                    f"connections from {', '.join(sorted({r.node for r in ranks if r.node}))} on "
                                    "its ephemeral ports" if peers else
                                    "; Gloo connects each pair of nodes from the higher address to the lower one's "
                                    "ephemeral ports, so the node with the lower address must accept new TCP "
                                    "connections from the others there")),
                    quotes=quotes(ranks), named_by_words=False,
                    fix=run("ddp-preflight " + (" ".join(g.node_order or nodes) or "HOST ...") + " --only ephemeral-ports",
                            note="names the node that drops them and the exact rule to open"))
    if Failure.RENDEZVOUS_TIMEOUT in by:
        return _rendezvous(g, [], by[Failure.RENDEZVOUS_TIMEOUT])
    for failure in (Failure.DUPLICATE_GPU, Failure.NCCL_INVALID_USAGE, Failure.NCCL_SYSTEM_ERROR, Failure.NCCL_ERROR):
        if failure in by:
            ranks = by[failure]
            named = ranks
            if failure is Failure.DUPLICATE_GPU and ranks[0].said is not None:
                extra = ranks[0].said.detail["ranks"][0]
                named = [r for r in ranks if r.rank == extra] or ranks
            return Root(Kind.EXITED, Reason.NCCL_ERROR, culprits=sorted(r.key for r in named),
                        quotes=quotes(named))
    for failure, reason in ((Failure.CUDA_OUT_OF_MEMORY, Reason.OUT_OF_MEMORY), (Failure.UNSUPPORTED, Reason.UNSUPPORTED)):
        if failure in by:
            ranks = [r for r in by[failure] if r.exception is not None and not r.exception.lost_peer] or by[failure]
            return Root(Kind.EXITED, reason, culprits=sorted(r.key for r in ranks), quotes=quotes(ranks),
                        fix=_unsupported_fix(g) if reason is Reason.UNSUPPORTED else None)
    ooms = [n for n in g.nodes if n.said.failure is Failure.OOM_KILLED]
    killed = [r for r in g.ranks if r.exit is not None and r.exit.signal == signal.SIGKILL]
    if ooms and killed:
        return Root(Kind.EXITED, Reason.OOM_KILLED, culprits=sorted(r.key for r in killed),
                    notes={r.key: ("signal 9, SIGKILL",) for r in killed},
                    quotes=quotes(ooms) + [q for r in killed for q in r.exit_quotes[:1]])
    watched = [r for r in g.ranks if r.watchdog is not None]
    if watched and not _behind_ranks(g):
        alone = len({r.rank for r in g.ranks if r.rank is not None}) < 2
        return Root(Kind.NETWORK_STALL, Reason.TIMED_OUT, culprits=sorted(r.key for r in watched),
                    certainty=Certainty.LIKELY, quotes=[q for r in watched for q in r.watchdog_quotes[:2]],
                    unknown_why="only its output was read: the other ranks' logs or Flight Recorder dumps say "
                                "which rank is behind" if alone else None)
    if Failure.COLLECTIVE_TIMEOUT in by and not _behind_ranks(g):
        timed = by[Failure.COLLECTIVE_TIMEOUT]
        others = [r for r in g.ranks if r not in timed and r.rank is not None]
        if not others or all(r.exception is not None and r.exception.lost_peer for r in others):
            return Root(Kind.NETWORK_STALL, Reason.TIMED_OUT, culprits=sorted(r.key for r in timed),
                        certainty=Certainty.LIKELY, quotes=quotes(timed))
        # Some ranks were not waiting: they are whom the others waited for.
        late = [r for r in others if not (r.exception is not None and r.said is not None)]
        one = len(late) == 1
        return Root(Kind.EXITED, Reason.BEHIND, culprits=[r.key for r in late] if one else [],
                    candidates=[] if one else sorted(r.key for r in late),
                    certainty=Certainty.LIKELY if one else Certainty.UNSURE, quotes=quotes(timed),
                    unknown_why=f"{who(r.key for r in timed)} timed out waiting in a collective "
                                f"({timed[0].said.detail.get('ms') if timed[0].said else '?'} ms) and "
                                f"{'it' if one else 'they'} did not")
    return None


def _hosts(peers: list[str]) -> str:
    return ", ".join(sorted({p.rsplit(":", 1)[0].strip("[]") for p in peers}))


def _address_family(g: Gathered, ranks: list[RankSeen]) -> Root:
    """The ranks whose own family is not the master's (rank 0's node's): theirs is the odd one."""
    own = {r.key: r.said.detail["own"] for r in ranks if r.said is not None}
    master = next((own[k] for k in sorted(own) if k == 0), None)
    if master is None and g.node_order:
        master = next((own[r.key] for r in ranks if r.node == g.node_order[0]), None)
    odd = sorted(k for k, family in own.items() if master is not None and family != master)
    notes = {}
    for r in ranks:
        if r.said is not None:
            notes[r.key] = (f"{family_name(r.said.detail['own'])} on {r.node or 'its node'} while its peer binds "
                            f"{family_name(r.said.detail['peer'])}",)
    nodes = sorted({r.node for r in ranks if r.key in odd and r.node})
    root = Root(Kind.EXITED, Reason.ADDRESS_FAMILY, culprits=odd, notes=notes, nodes=nodes,
                quotes=quotes([r for r in ranks if r.key in odd] or ranks),
                fix=_pin(g, nodes))
    if not odd:
        root.candidates, root.certainty = sorted(own), Certainty.UNSURE
    return root


def _pin(g: Gathered, nodes: list[str]) -> Fix:
    """The interface pin on these nodes in the form that reaches the next run: ddp-preflight
    --launch's --env NODE:NAME=VALUE for a launched run (an export never reaches it), else the
    export on each node before torchrun."""
    if g.launched:
        var = ifname_var("gloo")
        return Fix(Action.SET, (" ".join(f"--env {n}:{var}=<the LAN interface>" for n in nodes) if nodes else
                                f"--env {var}=<the LAN interface>",))
    return Fix(Action.SET, (pin_interface("gloo", None),), nodes[0] if len(nodes) == 1 else None,
               "on " + (", ".join(nodes) or "every node"))


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


def _unsupported_fix(g: Gathered) -> Fix | None:
    for seen in g.ranks:
        if seen.said is not None and seen.said.failure is Failure.UNSUPPORTED:
            if "getFuture" in str(seen.said.detail.get("call")):
                return workaround("<the collective>", ["async_future"], [], "gloo")
    return None


def _behind_ranks(g: Gathered) -> Joined | None:
    joined = join(g.ranks, g.world)
    return joined if joined is not None and joined.behind else None


def behind(g: Gathered) -> Root | None:
    joined = _behind_ranks(g)
    if joined is None:
        return None
    lines = [e.quote for e in joined.entered if e.rank in joined.behind] + \
        [e.quote for e in joined.entered if e.rank in joined.ahead][:3]
    return Root(Kind.DEADLOCK, Reason.BEHIND, culprits=list(joined.behind), quotes=lines, named_by_words=False)
