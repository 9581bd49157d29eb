"""The root of what the inputs show, as one hangwatch verdict (model.Diagnosis) with the lines it
rests on: the failure whose own words name a cause first (a launcher's, then a rank's), then the
rank the others' collectives say is behind, then a rank's own end (its exception, a signal, its
exit code), and only then the peers that lost it. The victims are evidence under it, never the
root. Pure: over what logs.py and records.py gathered."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from hangwatch import text
from hangwatch.causes import CAUSES, FAILURE_CAUSES
from hangwatch.failures import Failure, family_name
from hangwatch.model import Certainty, Diagnosis, Evidence, Kind, Reason, Seen
from hangwatch.model import RankStatus as S
from preflight.checks.launch_args import separate
from preflight.checks.network import ifname_var, pin_interface
from preflight.checks.processes import who_holds

from . import inputs, logs, records
from .join import Joined, join, last_entered
from .seen import Gathered, NodeSaid, Quote, RankSeen

UNKNOWN_RANK = 10**9       # evidence of a writer whose rank is not known: keyed past any real rank
SIGNAL = re.compile(r"signal (\d+)")
STOPPING_SIGNALS = (15, 2, 1)     # what a launcher sends when it stops ranks


@dataclass(frozen=True)
class Explanation:
    """What `explain` says: the verdict (None: no failure found), the fix to paste, the lines the
    verdict rests on, and what was read."""
    diagnosis: Diagnosis | None
    fix: str | None = None
    quotes: tuple[Quote, ...] = ()
    read: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"ok": self.diagnosis is None, "diagnosis": self.diagnosis.to_json() if self.diagnosis else None,
                "fix": self.fix, "quotes": [{"path": q.path, "line": q.line, "text": q.text} for q in self.quotes],
                "read": list(self.read), "skipped": list(self.skipped)}


def explain(paths: list[str]) -> Explanation:
    """Read every input (inputs.InputError when a path cannot be read at all) and name the root."""
    gathered = gather(inputs.find(paths))
    return decide(gathered)


def gather(found: list[inputs.Input]) -> Gathered:
    gathered = Gathered()
    order = {inputs.InputKind.PLAN: 0, inputs.InputKind.LOG: 1, inputs.InputKind.LAUNCH_RESULT: 2,
             inputs.InputKind.ERROR_FILE: 3, inputs.InputKind.FLIGHT: 4, inputs.InputKind.BUNDLE: 5}
    for item in sorted(found, key=lambda i: order.get(i.kind, 9)):
        kind = item.kind
        if kind is inputs.InputKind.OTHER:
            gathered.skipped.append(f"{item.path}: {item.why}")
            continue
        gathered.read.append(item.path)
        if kind is inputs.InputKind.LOG:
            logs.read_log(gathered, item.path)
        elif kind is inputs.InputKind.ERROR_FILE:
            records.read_error_file(gathered, item.path)
        elif kind is inputs.InputKind.FLIGHT:
            records.read_flight(gathered, item.path)
        elif kind is inputs.InputKind.BUNDLE:
            records.read_bundle(gathered, item.path)
        else:
            records.read_launch(gathered, item.path, plan=kind is inputs.InputKind.PLAN)
    _exits_from_tables(gathered)
    return gathered


def _exits_from_tables(gathered: Gathered) -> None:
    """torchrun's tables: each failed rank's exit code or signal, and its global rank."""
    for node, table, quote in gathered.tables:
        for child in (*table.others, table):
            if child.rank is None:
                continue
            seen = gathered.rank(node, child.rank, child.local_rank)
            if seen.exit is None and child.exitcode is not None:
                seen.exit = f"signal {-child.exitcode}" if child.exitcode < 0 else f"exit code {child.exitcode}"
                seen.exit_quotes.append(replace(quote, text=f"rank {child.rank} (local_rank {child.local_rank}) on "
                                                            f"{child.host or node}: exitcode {child.exitcode}"
                                                            + (f" ({child.signal})" if child.signal else "")))


# -- the decision ------------------------------------------------------------------------------------

@dataclass
class _Root:
    kind: Kind
    reason: Reason
    culprits: list[int] = field(default_factory=list)
    candidates: list[int] = field(default_factory=list)
    certainty: Certainty = Certainty.CERTAIN
    nodes: list[str] = field(default_factory=list)
    store: str | None = None
    unknown_why: str | None = None
    notes: dict[int, str] = field(default_factory=dict)     # a culprit's basis (Evidence.notes[0])
    quotes: list[Quote] = field(default_factory=list)
    fix: str | None = None
    named_by_words: bool = True                             # text.named renders it


def decide(g: Gathered) -> Explanation:
    root = (_launcher(g) or _said(g) or _behind(g) or _own_end(g) or _lost_peers(g))
    read, skipped = tuple(g.read), tuple(g.skipped)
    if root is None:
        return Explanation(None, read=read, skipped=skipped)
    evidence = _evidence(g, root)
    causes = _causes(root)
    d = Diagnosis(kind=root.kind, culprits=tuple(root.culprits), candidates=tuple(root.candidates), reason=root.reason,
                  certainty=root.certainty, evidence=tuple(evidence), causes=tuple(causes), nodes=tuple(root.nodes),
                  store=root.store, unknown_why=root.unknown_why, world=g.world)
    summary = (text.never_entered(d) if root.reason is Reason.BEHIND and any(e.seq is not None for e in evidence) else
               text.named(d) if root.named_by_words else text.summary(d))
    return Explanation(replace(d, summary=summary), root.fix, tuple(root.quotes), read, skipped)


def _key(seen: RankSeen, g: Gathered) -> int:
    return seen.rank if seen.rank is not None else UNKNOWN_RANK + g.ranks.index(seen)


def _launcher(g: Gathered) -> _Root | None:
    """What a launcher's own lines name: torchrun's parser, its store's port."""
    for failure, reason in ((Failure.SCRIPT_OPTIONS, Reason.SCRIPT_OPTIONS), (Failure.PORT_IN_USE, Reason.PORT_IN_USE)):
        said = [n for n in g.nodes if n.said.failure is failure]
        if not said:
            continue
        nodes = sorted({n.node for n in said if n.node})
        first = said[0]
        if reason is Reason.SCRIPT_OPTIONS:
            option = first.said.detail.get("option")
            return _Root(Kind.EXITED, reason, nodes=nodes, unknown_why=first.said.detail.get("what"),
                         quotes=_quotes(said), fix=separate(["SCRIPT", option] if option else ["SCRIPT"], "SCRIPT"))
        port = first.said.detail.get("port")
        return _Root(Kind.EXITED, reason, nodes=nodes, store=str(port) if port else None, quotes=_quotes(said),
                     fix=who_holds(nodes[0] if nodes else "the master", port or "MASTER_PORT"))
    rendezvous = [n for n in g.nodes if n.said.failure is Failure.RENDEZVOUS_TIMEOUT]
    if rendezvous:
        return _rendezvous(g, rendezvous, [])
    return None


def _said(g: Gathered) -> _Root | None:
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
        return _Root(Kind.RENDEZVOUS_STALL, Reason.CANNOT_CONNECT, nodes=nodes, certainty=Certainty.CERTAIN,
                     unknown_why=(f"Gloo's connectFullMesh failed on {text.who(_key(r, g) for r in ranks)} "
                                  f"({', '.join(sorted({r.node for r in ranks if r.node}))}): "
                                  f"{' / '.join(sorted(w for w in why if w))}"
                                  + (f" connecting to {', '.join(peers)}: {_hosts(peers)} must accept new TCP "
                                     f"connections from {', '.join(sorted({r.node for r in ranks if r.node}))} on "
                                     "its ephemeral ports" if peers else
                                     "; Gloo connects each pair of nodes from the higher address to the lower one's "
                                     "ephemeral ports, so the node with the lower address must accept new TCP "
                                     "connections from the others there")),
                     quotes=_quotes(ranks), named_by_words=False,
                     fix="ddp-preflight " + (" ".join(g.node_order or nodes) or "HOST ...") +
                         " --only ephemeral-ports   # names the node that drops them and the exact rule to open")
    if Failure.RENDEZVOUS_TIMEOUT in by:
        return _rendezvous(g, [], by[Failure.RENDEZVOUS_TIMEOUT])
    for failure in (Failure.DUPLICATE_GPU, Failure.NCCL_INVALID_USAGE, Failure.NCCL_SYSTEM_ERROR, Failure.NCCL_ERROR):
        if failure in by:
            ranks = by[failure]
            named = ranks
            if failure is Failure.DUPLICATE_GPU and ranks[0].said is not None:
                extra = ranks[0].said.detail["ranks"][0]
                named = [r for r in ranks if r.rank == extra] or ranks
            return _Root(Kind.EXITED, Reason.NCCL_ERROR, culprits=sorted(_key(r, g) for r in named),
                         quotes=_quotes(named))
    for failure, reason in ((Failure.CUDA_OUT_OF_MEMORY, Reason.OUT_OF_MEMORY), (Failure.UNSUPPORTED, Reason.UNSUPPORTED)):
        if failure in by:
            ranks = [r for r in by[failure] if r.exception is not None and not r.exception.lost_peer] or by[failure]
            return _Root(Kind.EXITED, reason, culprits=sorted(_key(r, g) for r in ranks), quotes=_quotes(ranks),
                         fix=_unsupported_fix(g) if reason is Reason.UNSUPPORTED else None)
    ooms = [n for n in g.nodes if n.said.failure is Failure.OOM_KILLED]
    killed = [r for r in g.ranks if r.exit == "signal 9"]
    if ooms and killed:
        return _Root(Kind.EXITED, Reason.OOM_KILLED, culprits=sorted(_key(r, g) for r in killed),
                     notes={_key(r, g): "signal 9, SIGKILL" for r in killed},
                     quotes=_quotes(ooms) + [q for r in killed for q in r.exit_quotes[:1]])
    watched = [r for r in g.ranks if r.watchdog is not None]
    if watched and not _behind_ranks(g):
        alone = len({r.rank for r in g.ranks if r.rank is not None}) < 2
        return _Root(Kind.NETWORK_STALL, Reason.TIMED_OUT, culprits=sorted(_key(r, g) for r in watched),
                     certainty=Certainty.LIKELY, quotes=[q for r in watched for q in r.watchdog_quotes[:2]],
                     unknown_why="only its output was read: the other ranks' logs or Flight Recorder dumps say "
                                 "which rank is behind" if alone else None)
    if Failure.COLLECTIVE_TIMEOUT in by and not _behind_ranks(g):
        timed = by[Failure.COLLECTIVE_TIMEOUT]
        others = [r for r in g.ranks if r not in timed and r.rank is not None]
        if not others or all(r.exception is not None and r.exception.lost_peer for r in others):
            return _Root(Kind.NETWORK_STALL, Reason.TIMED_OUT, culprits=sorted(_key(r, g) for r in timed),
                         certainty=Certainty.LIKELY, quotes=_quotes(timed))
        # Some ranks were not waiting: they are whom the others waited for.
        late = [r for r in others if not (r.exception is not None and r.said is not None)]
        one = len(late) == 1
        return _Root(Kind.EXITED, Reason.BEHIND, culprits=[_key(r, g) for r in late] if one else [],
                     candidates=[] if one else sorted(_key(r, g) for r in late),
                     certainty=Certainty.LIKELY if one else Certainty.UNSURE, quotes=_quotes(timed),
                     unknown_why=f"{text.who(_key(r, g) for r in timed)} timed out waiting in a collective "
                                 f"({timed[0].said.detail.get('ms') if timed[0].said else '?'} ms) and "
                                 f"{'it' if one else 'they'} did not")
    return None


def _hosts(peers: list[str]) -> str:
    return ", ".join(sorted({p.rsplit(":", 1)[0].strip("[]") for p in peers}))


def _address_family(g: Gathered, ranks: list[RankSeen]) -> _Root:
    """The ranks whose own family is not the master's (rank 0's node's): theirs is the odd one."""
    own = {_key(r, g): r.said.detail["own"] for r in ranks if r.said is not None}
    master = next((own[k] for k in sorted(own) if k == 0), None)
    if master is None and g.node_order:
        master = next((own[_key(r, g)] for r in ranks if r.node == g.node_order[0]), None)
    odd = sorted(k for k, family in own.items() if master is not None and family != master)
    notes = {}
    for r in ranks:
        if r.said is not None:
            notes[_key(r, g)] = (f"{family_name(r.said.detail['own'])} on {r.node or 'its node'} while its peer binds "
                                 f"{family_name(r.said.detail['peer'])}")
    nodes = sorted({r.node for r in ranks if _key(r, g) in odd and r.node})
    root = _Root(Kind.EXITED, Reason.ADDRESS_FAMILY, culprits=odd, notes=notes, nodes=nodes,
                 quotes=_quotes([r for r in ranks if _key(r, g) in odd] or ranks),
                 fix=_pin(g, nodes))
    if not odd:
        root.candidates, root.certainty = sorted(own), Certainty.UNSURE
    return root


def _pin(g: Gathered, nodes: list[str]) -> str:
    """The interface pin on these nodes in the form that reaches the next run: ddp-preflight
    --launch's --env NODE:NAME=VALUE for a launched run (an export never reaches it), else the
    export on each node before torchrun."""
    if g.launched:
        var = ifname_var("gloo")
        return " ".join(f"--env {n}:{var}=<the LAN interface>" for n in nodes) if nodes else \
            f"--env {var}=<the LAN interface>"
    return pin_interface("gloo", None) + "   # on " + (", ".join(nodes) or "every node")


def _rendezvous(g: Gathered, said: list[NodeSaid], ranks: list[RankSeen]) -> _Root:
    details = [n.said.detail for n in said] + [r.said.detail for r in ranks if r.said]
    store = next((d["store"] for d in details if d.get("store")), None)
    waited = next((d for d in details if d.get("side") == "store"), None)
    client_nodes = sorted({n.node for n in said if n.node and n.said.detail.get("side") == "client"} |
                          {r.node for r in ranks if r.node and r.said and r.said.detail.get("side") == "client"})
    quotes = _quotes(said) + _quotes(ranks)
    waiting = (f"the store waited {waited['seconds']} s and {waited['joined']} of {waited['world']} torchruns joined"
               if waited else None)
    if client_nodes:
        said_by_client = next((d["said"] for d in details if d.get("said")), "it timed out")
        return _Root(Kind.RENDEZVOUS_STALL, Reason.CANNOT_REACH_STORE, nodes=client_nodes, store=store,
                     culprits=sorted(_key(r, g) for r in ranks), quotes=quotes,
                     unknown_why=said_by_client + (f"; {waiting}" if waiting else ""))
    return _Root(Kind.RENDEZVOUS_STALL, Reason.NEVER_CHECKED_IN, certainty=Certainty.UNSURE, store=store,
                 nodes=sorted({n.node for n in said if n.node}), unknown_why=waiting or "the rendezvous timed out",
                 quotes=quotes)


def _unsupported_fix(g: Gathered) -> str | None:
    from preflight.checks.collectives import workaround
    for seen in g.ranks:
        if seen.said is not None and seen.said.failure is Failure.UNSUPPORTED:
            if "getFuture" in str(seen.said.detail.get("call")):
                return workaround("<the collective>", ["async_future"], [], "gloo")
    return None


def _behind_ranks(g: Gathered) -> Joined | None:
    joined = join(g.ranks, g.world)
    return joined if joined is not None and joined.behind else None


def _behind(g: Gathered) -> _Root | None:
    joined = _behind_ranks(g)
    if joined is None:
        return None
    quotes = [e.quote for e in joined.entered if e.rank in joined.behind] + \
             [e.quote for e in joined.entered if e.rank in joined.ahead][:3]
    return _Root(Kind.DEADLOCK, Reason.BEHIND, culprits=list(joined.behind), quotes=quotes, named_by_words=False)


def _signal(seen: RankSeen) -> int | None:
    found = SIGNAL.match(seen.exit or "")
    return int(found.group(1)) if found else None


def _own_end(g: Gathered) -> _Root | None:
    """A rank that ended by itself: its own exception, a signal no launcher sends, its own exit code."""
    raised = [r for r in g.ranks if r.exception is not None and not r.exception.lost_peer]
    if raised:
        return _Root(Kind.EXITED, Reason.RAISED, culprits=sorted(_key(r, g) for r in raised), quotes=_quotes(raised),
                     named_by_words=False)
    # A signal no launcher sends, on a rank that said nothing of its own end (SIGABRT after a lost
    # peer is its teardown; SIGABRT alone is a C++ abort whose cause its output would show).
    killed = [r for r in g.ranks if _signal(r) not in (None, 6, *STOPPING_SIGNALS) and not r.stopped
              and r.exception is None]
    if killed:
        return _Root(Kind.EXITED, Reason.KILLED, culprits=sorted(_key(r, g) for r in killed),
                     quotes=[q for r in killed for q in r.exit_quotes[:1]], named_by_words=False)
    coded = [r for r in g.ranks if r.exit and r.exit.startswith("exit code") and r.exit != "exit code 0"
             and r.exception is None and not r.stopped]
    if coded:
        return _Root(Kind.EXITED, Reason.EXIT_CODE, culprits=sorted(_key(r, g) for r in coded),
                     certainty=Certainty.LIKELY, quotes=[q for r in coded for q in r.exit_quotes[:1]],
                     named_by_words=False)
    return None


def _lost_peers(g: Gathered) -> _Root | None:
    """Only victims: the ranks that lost a peer; the peer is whichever rank nothing says ended."""
    lost = [r for r in g.ranks if r.exception is not None and r.exception.lost_peer]
    if not lost:
        return None
    world = g.world or _world_seen(g)
    quiet = sorted(r for r in range(world or 0) if not any(s.rank == r and (s.exception or s.exit) for s in g.ranks))
    if not quiet:
        return _Root(Kind.EXITED, Reason.LOST_PEER, certainty=Certainty.LIKELY, quotes=_quotes(lost[:2]),
                     nodes=sorted({r.node for r in lost if r.node}),
                     unknown_why=f"{text.who(_key(r, g) for r in lost)} lost a peer or the link")
    one = len(quiet) == 1
    return _Root(Kind.EXITED, Reason.LEFT_FIRST, culprits=quiet if one else [], candidates=[] if one else quiet,
                 certainty=Certainty.LIKELY if one else Certainty.UNSURE, quotes=_quotes(lost[:2]),
                 unknown_why=f"{text.who(_key(r, g) for r in lost)} lost {'it' if one else 'one of them'}")


def _world_seen(g: Gathered) -> int | None:
    ranks = [r.rank for r in g.ranks if r.rank is not None]
    return max(ranks) + 1 if ranks else None


def _quotes(items) -> list[Quote]:
    out: list[Quote] = []
    items = sorted(items, key=lambda i: i.rank if getattr(i, "rank", None) is not None else UNKNOWN_RANK)
    for item in items:
        for quote in (item.quotes if hasattr(item, "quotes") else []):
            if quote not in out:
                out.append(quote)
        if len(out) >= 8:
            break
    return out


# -- evidence and causes ---------------------------------------------------------------------------

def _evidence(g: Gathered, root: _Root) -> list[Evidence]:
    entered = {e.rank: e for e in (last_entered(r) for r in g.ranks) if e is not None}
    out = []
    for seen in sorted(g.ranks, key=lambda r: _key(r, g)):
        key = _key(seen, g)
        info = seen.exception
        exception = (Seen(info.type, info.message, f"{info.file}:{info.line}" if info.file else None, info.function,
                          info.lost_peer, info.peer, seen.source) if info is not None else None)
        place = entered.get(seen.rank) if seen.rank is not None else None
        reason = _reason_of(seen, root, key)
        ended = seen.exit is not None or (info is not None and not (place and seen.watchdog))
        quotes = seen.quotes or seen.exit_quotes or seen.watchdog_quotes
        quote = quotes[0] if quotes else None
        note = root.notes.get(key)
        out.append(Evidence(
            node=seen.node or "", pid=0 if seen.rank is not None else key, rank=seen.rank,
            state=S.EXITED if ended else (S.COLLECTIVE if place else S.UNKNOWN), reason=reason,
            op=place.op if place else None,
            frame=(exception.where if exception else None) or (place.frame if place else None) or seen.frame,
            function=info.function if info else None, exit=seen.exit, exception=exception,
            seq=place.seq if place else None, seq_op=place.op if place else None,
            completed=place.completed if place else None, quote=str(quote) if quote else None,
            notes=(note,) if note else ()))
    return out


def _reason_of(seen: RankSeen, root: _Root, key: int) -> Reason | None:
    if key in root.culprits:
        return root.reason
    if seen.exception is not None:
        return Reason.LOST_PEER if seen.exception.lost_peer else Reason.RAISED
    signal = _signal(seen)
    if seen.stopped or signal in STOPPING_SIGNALS:
        return Reason.STOPPED_BY_LAUNCHER if seen.stopped else Reason.TERMINATED
    if signal is not None:
        return Reason.KILLED
    if seen.exit and seen.exit != "exit code 0":
        return Reason.FAILED
    return None


def _causes(root: _Root) -> list[str]:
    causes = list(FAILURE_CAUSES.get(root.reason, ()) or CAUSES.get(root.reason, ()))
    if root.fix:
        causes = [c + f". Fix: {root.fix}" if i == 0 and "Fix:" not in c else c for i, c in enumerate(causes)] or \
            [f"Fix: {root.fix}"]
    return causes
