"""What the ranks' own failure words name (the one catalogue's messages, rules/failures.py, read by
failures.said_by from each exception's type, message and chain): the address family, a pair that
never connected, the store that was never reached, NCCL's errors, CUDA's memory, a call the
backend lacks, a collective's timeout. The first step of the one judge of a run's ends: every
mode (the live watcher from its agents and launcher, a launch's summary, explain from the files)
gives its ends as exits.Ending and calls judge(), so a message means one thing wherever it was
read. Pure: a function of the endings and the ranks still running."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ddp_preflight.rules.collectives import workaround
from ddp_preflight.rules.failure_kinds import Cause
from ddp_preflight.rules.failure_kinds import FailureKind as K
from ddp_preflight.rules.fix import Action, Fix, run
from ddp_preflight.rules.launch_args import separate
from ddp_preflight.rules.ports import who_holds
from ddp_preflight.rules.routes import ifname_var, pin_interface

from . import causes, exits
from .exits import Ending
from .failures import Said, family_name, said_by, usage_error, watchdog
from .model import Basis, Certainty, Diagnosis, Evidence, Kind, Reason, Who
from .tracebacks import ExceptionInfo
from .who import who


@dataclass(frozen=True)
class Named:
    """A verdict a failure's words decided, the fix the words let it build (a pin, a workaround),
    and the ranks whose words decided it (their lines are what it rests on)."""
    diagnosis: Diagnosis
    fix: Fix | None = None
    said_by: tuple[Who, ...] = ()
    launchers: tuple[LauncherSaid, ...] = ()     # the launchers' words that decided it


@dataclass(frozen=True)
class LauncherSaid:
    """What a launcher's own lines name on a node (torchrun's parser, its store, its rendezvous),
    not a rank's: read by the files' reader (explain) and, from a launch's output, by the launcher."""
    node: str | None
    said: Said


@dataclass(frozen=True)
class Context:
    """What a mode knows of the run beyond its ends: the master's node (rank 0's), the nodes in
    node-rank order, and whether ddp-preflight --launch ran it (a fix then goes in its --env)."""
    master: str | None = None
    nodes: tuple[str, ...] = ()
    launched: bool = False


LAUNCHERS = (K.SCRIPT_OPTIONS, K.PORT_IN_USE, K.STORE_TIMEOUT)    # a launcher's own words


def launcher_said(info: ExceptionInfo | None, line: str) -> Said | None:
    """What a launcher's own output names (torchrun's, not a rank's): the words of the exception
    its lines show so far (type, message with its chain's), else the line itself (its parser's
    usage error). None: nothing of a launcher's own failure."""
    if info is not None:
        found = said_by(info.type, info.message + (f"\n{info.cause}" if info.cause else ""))
        if found is not None and found.failure in LAUNCHERS:
            return found
    return usage_error(line)


def launcher_said_in(text: str) -> Said | None:
    """What a launcher's own report of its failure names, read by the catalogue's patterns (the
    launch program's "torchrun failed" with torch's own words in it: its store's port in use)."""
    found = said_by("", text)
    return found if found is not None and found.failure in LAUNCHERS else usage_error(text)


def said(ending: Ending) -> Said | None:
    """What an ending's exception's words name (its chain's earlier message too). NCCL's watchdog
    line on a rank ("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=65, ...,
    Timeout(ms)=60000) ran for 60022 milliseconds") is its collective's timeout, in every mode: the
    live watcher's (the rank's output, then its abort) as the files' (explain read it alone before)."""
    seen = ending.exception
    if seen is None:
        return None
    text = seen.message + (f"\n{seen.cause}" if seen.cause else "")
    found = said_by(seen.type, text)
    if found is None:
        line = watchdog(text)
        if line is not None and line.timeout_ms is not None:
            return Said(K.TIMEOUT_UNKNOWN_ROOT, {"ms": line.timeout_ms, "seq": line.seq, "op": line.op})
    return found


def judge(endings: Sequence[Ending], running: Sequence[Evidence] = (), unseen: Sequence[Evidence] = (),
          context: Context = Context(), launchers: Sequence[LauncherSaid] = ()) -> Diagnosis | None:
    """The one judge of a run's ends: what the launchers' and the ranks' failure words name, else
    who failed first (exits.judge)."""
    found = by_words(endings, running, context, launchers)
    return found.diagnosis if found is not None else exits.judge(endings, running, unseen)


def by_words(endings: Sequence[Ending], running: Sequence[Evidence] = (), context: Context = Context(),
             launchers: Sequence[LauncherSaid] = ()) -> Named | None:
    """The first root the failure words name, in the order a run fails in: its launchers' (torchrun's
    parser, its store's port, its rendezvous), then its ranks'; None: they name none."""
    by: dict[K, list[tuple[Ending, Said]]] = {}
    for e in endings:
        s = said(e)
        if s is not None:
            by.setdefault(s.failure, []).append((e, s))
    found = by_launchers(launchers) or _decide(by, endings, running, context)
    if found is None:
        return None
    d = found.diagnosis
    reads = {e.key: exits.read(e, endings) for e in endings}
    evidence = tuple(_as_named(exits.evidence_of(r), d, _said_of(d, r.ending, by)) for r in reads.values()) + \
        tuple(running)
    return replace(found, diagnosis=replace(d, evidence=evidence, causes=causes.of(d.reason, found.fix)))


def by_launchers(launchers: Sequence[LauncherSaid]) -> Named | None:
    """What a launcher's own lines name: torchrun's parser took the script's options, its store's
    port is in use, its rendezvous timed out. No rank started (or none is to blame): nodes are named."""
    for failure, reason in ((K.SCRIPT_OPTIONS, Reason.SCRIPT_OPTIONS), (K.PORT_IN_USE, Reason.PORT_IN_USE)):
        said = [n for n in launchers if n.said.failure is failure]
        if not said:
            continue
        nodes = tuple(sorted({n.node for n in said if n.node}))
        detail = said[0].said.detail
        if reason is Reason.SCRIPT_OPTIONS:
            option = detail.get("option")
            return Named(Diagnosis(Kind.EXITED, (), (), reason, Certainty.CERTAIN, nodes=nodes,
                                   unknown_why=detail.get("what"), basis=Basis.WORDS),
                         separate(["SCRIPT", option] if option else ["SCRIPT"], "SCRIPT"), launchers=tuple(said))
        port = detail.get("port")
        return Named(Diagnosis(Kind.EXITED, (), (), reason, Certainty.CERTAIN, nodes=nodes,
                               store=str(port) if port else None, basis=Basis.WORDS),
                     who_holds(nodes[0] if nodes else "the master", port or "MASTER_PORT"), launchers=tuple(said))
    said = [n for n in launchers if n.said.failure is K.STORE_TIMEOUT]
    if not said:
        return None
    details = [n.said.detail for n in said]
    store = next((d["store"] for d in details if d.get("store")), None)
    waited = next((d for d in details if d.get("side") == "store"), None)
    waiting = (f"the store waited {waited['seconds']} s and {waited['joined']} of {waited['world']} torchruns joined"
               if waited else None)
    clients = tuple(sorted({n.node for n in said if n.node and n.said.detail.get("side") == "client"}))
    if clients:
        said_by_client = next((d["said"] for d in details if d.get("said")), "it timed out")
        d = Diagnosis(Kind.RENDEZVOUS_STALL, (), (), Reason.CANNOT_REACH_STORE, Certainty.CERTAIN, nodes=clients,
                      store=store, unknown_why=said_by_client + (f"; {waiting}" if waiting else ""), basis=Basis.WORDS)
    else:
        d = Diagnosis(Kind.RENDEZVOUS_STALL, (), (), Reason.NEVER_CHECKED_IN, Certainty.UNSURE, store=store,
                      nodes=tuple(sorted({n.node for n in said if n.node})),
                      unknown_why=waiting or "the rendezvous timed out", basis=Basis.WORDS)
    return Named(d, launchers=tuple(said))


def _as_named(e: Evidence, d: Diagnosis, said: str | None) -> Evidence:
    """A rank's evidence under a verdict the words decided: its reason the verdict's where it is
    named; what the words said of it (an address family) is what named it."""
    return replace(e, reason=d.reason if e.key in d.named else e.reason, notes=(said,) if said else (),
                   named_by=said)


def _said_of(d: Diagnosis, e: Ending, by: dict[K, list[tuple[Ending, Said]]]) -> str | None:
    """What the words said of this rank, where the verdict rests on it: its address family."""
    if d.reason is not Reason.ADDRESS_FAMILY:
        return None
    for ending, s in by.get(K.ADDRESS_FAMILY, ()):
        if ending.key == e.key:
            return (f"{family_name(s.detail['own'])} on {e.node or 'its node'} while its peer binds "
                    f"{family_name(s.detail['peer'])}")
    return None


def _decide(by: dict[K, list[tuple[Ending, Said]]], endings: Sequence[Ending], running: Sequence[Evidence],
            context: Context) -> Named | None:
    if K.ADDRESS_FAMILY in by:
        return _address_family(by[K.ADDRESS_FAMILY], context)
    if K.MISMATCH in by:
        return _size_mismatch(by[K.MISMATCH])
    if K.CANNOT_CONNECT in by:
        return _cannot_connect(by[K.CANNOT_CONNECT], endings, context)
    if K.STORE_TIMEOUT in by:
        return _rendezvous(by[K.STORE_TIMEOUT])
    if K.NCCL_ERROR in by:
        # NCCL's causes in the order a run fails in: a duplicate GPU is why NCCL said invalid usage
        order = (Cause.DUPLICATE_GPU, Cause.NCCL_INVALID_USAGE, Cause.NCCL_SYSTEM_ERROR)
        said = by[K.NCCL_ERROR]
        first = min((s.cause for _, s in said), key=lambda c: order.index(c) if c in order else len(order))
        ranks = named = [(e, s) for e, s in said if s.cause is first]
        if first is Cause.DUPLICATE_GPU:
            extra = ranks[0][1].detail["ranks"][0]
            named = [(e, s) for e, s in ranks if e.rank == extra] or ranks
        keys = tuple(sorted(e.key for e, _ in named))
        return Named(Diagnosis(Kind.EXITED, keys, (), Reason.NCCL_ERROR, Certainty.CERTAIN, basis=Basis.WORDS),
                     said_by=keys)
    for failure, reason in ((K.OOM_CUDA, Reason.OUT_OF_MEMORY), (K.UNSUPPORTED, Reason.UNSUPPORTED)):
        if failure in by:
            own = [(e, s) for e, s in by[failure] if e.exception is not None and not e.exception.lost_peer] or \
                by[failure]
            keys = tuple(sorted(e.key for e, _ in own))
            fix = _unsupported_fix(by[failure]) if reason is Reason.UNSUPPORTED else None
            return Named(Diagnosis(Kind.EXITED, keys, (), reason, Certainty.CERTAIN, basis=Basis.WORDS), fix, keys)
    if K.TIMEOUT_UNKNOWN_ROOT in by:
        return _timed_out(by[K.TIMEOUT_UNKNOWN_ROOT], endings, running)
    return None


def _address_family(ranks: list[tuple[Ending, Said]], context: Context) -> Named:
    """The ranks whose own family is not the master's (rank 0's, else its node's): theirs is the odd one."""
    own = {e.key: s.detail["own"] for e, s in ranks}
    master = own.get(0)
    if master is None and context.master is not None:
        master = next((own[e.key] for e, _ in ranks if e.node == context.master), None)
    odd = tuple(sorted(k for k, family in own.items() if master is not None and family != master))
    nodes = tuple(sorted({e.node for e, _ in ranks if e.key in odd and e.node}))
    d = Diagnosis(Kind.EXITED, odd, (), Reason.ADDRESS_FAMILY, Certainty.CERTAIN, nodes=nodes, basis=Basis.WORDS)
    if not odd:
        d = replace(d, candidates=tuple(sorted(own)), certainty=Certainty.UNSURE)
    return Named(d, _pin(context, list(nodes)), odd or tuple(sorted(own)))


def _pin(context: Context, nodes: list[str]) -> Fix:
    """The interface pin on these nodes in the form that reaches the next run: ddp-preflight
    --launch's --env NODE:NAME=VALUE for a launched run (an export never reaches it), else the
    export on each node before torchrun."""
    if context.launched:
        var = ifname_var("gloo")
        return Fix(Action.SET, (" ".join(f"--env {n}:{var}=<the LAN interface>" for n in nodes) if nodes else
                                f"--env {var}=<the LAN interface>",))
    return Fix(Action.SET, (pin_interface("gloo", None),), nodes[0] if len(nodes) == 1 else None,
               "on " + (", ".join(nodes) or "every node"))


def _size_mismatch(ranks: list[tuple[Ending, Said]]) -> Named:
    """Gloo's own words: a rank received more bytes than its collective expected, so the ranks issued
    collectives of different sizes. The rank that read it aborted by itself; which rank issued the
    other collective, the words do not say."""
    keys = tuple(sorted(e.key for e, _ in ranks))
    sizes = [(s.detail.get("got"), s.detail.get("expected")) for _, s in ranks]
    got, expected = next(((g, x) for g, x in sizes if g is not None), (None, None))
    d = Diagnosis(Kind.MISMATCH, (), (), Reason.SIZE_MISMATCH, Certainty.CERTAIN, basis=Basis.WORDS,
                  unknown_why=f"{who(keys)} aborted on it" + (f" ({got} bytes vs {expected})" if got else "")
                              + "; which rank issued the other collective, Gloo's words do not say")
    return Named(d, said_by=keys)


def _cannot_connect(ranks: list[tuple[Ending, Said]], endings: Sequence[Ending], context: Context) -> Named:
    """Gloo's connectFullMesh failed: a pair of nodes never connected (a firewall on the ephemeral
    ports, a refused connect). No rank is to blame: a node's rule is, and the probe names it."""
    peers = sorted({s.detail["peer"] for _, s in ranks if s.detail.get("peer")})
    why = sorted({s.detail["why"] for _, s in ranks if s.detail.get("why")})
    said_nodes = ", ".join(sorted({e.node for e, _ in ranks if e.node}))
    nodes = tuple(sorted({e.node for e in endings if e.node}))
    hosts = ", ".join(sorted({p.rsplit(":", 1)[0].strip("[]") for p in peers}))
    unknown_why = (f"Gloo's connectFullMesh failed on {who(e.key for e, _ in ranks)} ({said_nodes}): {' / '.join(why)}"
                   + (f" connecting to {', '.join(peers)}: {hosts} must accept new TCP connections from {said_nodes} "
                      "on its ephemeral ports" if peers else
                      "; Gloo connects each pair of nodes from the higher address to the lower one's ephemeral ports, "
                      "so the node with the lower address must accept new TCP connections from the others there"))
    fix = run("ddp-preflight " + (" ".join(context.nodes or nodes) or "HOST ...") + " --only ephemeral-ports",
              note="names the node that drops them and the exact rule to open")
    d = Diagnosis(Kind.RENDEZVOUS_STALL, (), (), Reason.CANNOT_CONNECT, Certainty.CERTAIN, nodes=nodes,
                  unknown_why=unknown_why)
    return Named(d, fix, tuple(sorted(e.key for e, _ in ranks)))


def _rendezvous(ranks: list[tuple[Ending, Said]]) -> Named:
    """A rank's store timed out: its client never reached the store (the store's own side is its
    launcher's line, which the files and the launch read as the node's)."""
    details = [s.detail for _, s in ranks]
    store = next((d["store"] for d in details if d.get("store")), None)
    clients = tuple(sorted({e.node for e, s in ranks if e.node and s.detail.get("side") == "client"}))
    keys = tuple(sorted(e.key for e, _ in ranks))
    if clients:
        said_by_client = next((d["said"] for d in details if d.get("said")), "it timed out")
        return Named(Diagnosis(Kind.RENDEZVOUS_STALL, keys, (), Reason.CANNOT_REACH_STORE, Certainty.CERTAIN,
                               nodes=clients, store=store, unknown_why=said_by_client, basis=Basis.WORDS), said_by=keys)
    return Named(Diagnosis(Kind.RENDEZVOUS_STALL, (), (), Reason.NEVER_CHECKED_IN, Certainty.UNSURE, store=store,
                           unknown_why="the rendezvous timed out", basis=Basis.WORDS), said_by=keys)


def _timed_out(timed: list[tuple[Ending, Said]], endings: Sequence[Ending], running: Sequence[Evidence]) -> Named:
    """Ranks timed out waiting in a collective: the ranks that were not waiting (still running, or
    ended with words that name no failure of their own) are whom they waited for; when every other
    rank lost a peer, or none is seen, the link or the timeout is (likely)."""
    keys = {e.key for e, _ in timed}
    others = [e for e in endings if e.key not in keys and e.rank is not None]
    alive = [r.key for r in running if r.key not in keys]
    if not alive and all(e.exception is not None and e.exception.lost_peer for e in others):
        culprits = tuple(sorted(keys))
        return Named(Diagnosis(Kind.NETWORK_STALL, culprits, (), Reason.TIMED_OUT, Certainty.LIKELY, basis=Basis.WORDS),
                     said_by=culprits)
    late: list[Who] = [e.key for e in others if not (e.exception is not None and said(e) is not None)] + alive
    one = len(late) == 1
    ms = timed[0][1].detail.get("ms")
    d = Diagnosis(Kind.EXITED, tuple(late) if one else (), () if one else tuple(sorted(late)), Reason.BEHIND,
                  Certainty.LIKELY if one else Certainty.UNSURE, basis=Basis.WORDS,
                  unknown_why=f"{who(keys)} timed out waiting in a collective ({ms} ms) and "
                              f"{'it' if one else 'they'} did not")
    return Named(d, said_by=tuple(sorted(keys)))


def _unsupported_fix(ranks: list[tuple[Ending, Said]]) -> Fix | None:
    if any("getFuture" in str(s.detail.get("call")) for _, s in ranks):
        return workaround("<the collective>", ["async_future"], [], "gloo")
    return None
