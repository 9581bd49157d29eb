"""master-reachable and ephemeral-ports: judged from what the network probe saw. Every path is
judged on its own: into a node from the other nodes, and from a node to itself (its ranks
connect to each other on its own address when it runs more than one)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

from rules.environment import env_fix
from rules.facts import Missing
from rules.fix import Fix, run
from rules.routes import ReversePathDrop, dead_route, drop_route, loosen_or_drop

from ..model import Context, NodeFacts, Status, Verdict
from ..probes.network_seen import Dial, DialKind, Listener, NetworkSeen
from .common import probed
from .reverse_path import counted, reverse_path_drop

MEANING = {
    "filtered": "silently dropped (a firewall)",
    "rejected": "rejected (a firewall's REJECT rule)",
    "refused": "refused although the probe listened there (a REJECT rule with a TCP reset)",
    "unreachable": "unreachable (no route, or another address family)",
    "error": "failed",
}


def check_master_reachable(ctx: Context) -> Iterator[Verdict]:
    seen, early = probed(ctx, "network", NetworkSeen.from_json)
    if seen is None:
        yield from [early] if early else []
        return
    master = seen.master
    if master is None:
        yield Verdict(Status.SKIP, ctx.master.node, "one node: no worker dials the master")
        return
    if master.error is not None:
        yield Verdict(Status.SKIP, ctx.master.node,
                      f"not probed: the probe could not listen on the master port ({master.error}); see master-port")
        return
    port = master.port
    for dial in (d for d in seen.dials if d.kind is DialKind.MASTER):
        details = dial.to_json()
        where = f"{master.address}:{port}"
        if dial.outcome == "open":
            yield Verdict(Status.PASS, dial.src, f"opens a connection to the master at {where}", None, details)
            continue
        said = f"cannot reach the master at {where}: {MEANING.get(dial.outcome, dial.outcome)}" + \
            (f" ({dial.detail})" if dial.detail else "")
        src = next((n for n in ctx.nodes if n.node == dial.src), None)
        dead = dead_route(src) if src is not None else None
        if dead is not None:
            # The cause is on the node that dials: its own route sends the master's address out a
            # link that carries nothing. Not the master's firewall.
            route, why = dead
            yield Verdict(Status.FAIL, dial.src,
                          f"cannot reach the master at {where}: {dial.src}'s route to {route.address} goes out "
                          f"{route.interface}, which {why}: its connections to the master go nowhere; rendezvous "
                          "will time out", drop_route(dial.src, route),
                          {**details, "route": dict(route.sent)})
            continue
        rp = reverse_path_drop(ctx, seen, dial.src, [dial])
        if rp is not None:
            # The master's answers reach the worker on one interface, its route back goes out
            # another, and its strict reverse-path filter drops them. Not the master's firewall.
            yield Verdict(Status.FAIL, dial.src,
                          f"cannot reach the master at {where}: {rp.why(dial.src)}{counted(seen, dial.src)}; "
                          "rendezvous will time out", loosen_or_drop(dial.src, rp),
                          {**details, **_reverse_path_details(rp, seen, dial.src)})
            continue
        fix = _open_port(ctx.master, port)
        if fix is None:
            said += (f"; the master's own firewall drops nothing on input (its ruleset, read as root), so the "
                     f"connection is lost on the way or on {dial.src} (`ip route get {master.address}` there shows "
                     "its route)")
        yield Verdict(Status.FAIL, dial.src, said + "; rendezvous will time out", fix, details)


def _reverse_path_details(rp: ReversePathDrop, seen: NetworkSeen, name: str) -> dict:
    listener = seen.listeners.get(name)
    return {"route": dict(rp.route.sent),
            "reverse_path": {"node": name, "arriving": rp.arriving.name, "address": rp.address,
                             "rp_filter": rp.arriving.rp_filter,
                             "drops_while_probed": listener.rp_filter_drops if listener else None}}


def _open_port(master: NodeFacts, port: int | None) -> Fix | None:
    """The master's firewall rule for its port, only where its firewall could be the cause: a
    ruleset read as root that drops nothing on input is not (a fix is checked against the facts
    it applies to), and its chain is the one the ruleset names."""
    net = master.parsed.network
    firewall = None if isinstance(net, Missing) else net.firewall
    if firewall is not None and not isinstance(firewall, Missing) and firewall.readable and \
            not firewall.input_drops and not firewall.input_policy_drop:
        return None
    return run(f"on {master.node}: sudo ufw allow proto tcp to any port {port}", master.node,
               f"or: sudo nft insert rule {_chain(master)} tcp dport {port} accept")


def _lower(a: str, b: str) -> bool | None:
    """Whether address a sorts below b the way Gloo compares them (bytes, one family)."""
    try:
        x, y = ipaddress.ip_address(a), ipaddress.ip_address(b)
    except ValueError:
        return None
    return x.packed < y.packed if x.version == y.version else None


def _subnet(node: NodeFacts, address: str) -> str:
    network = node.parsed.network
    for iface in () if isinstance(network, Missing) else network.interfaces:
        for a in iface.addresses:
            if a.address == address and a.prefixlen is not None:
                return str(ipaddress.ip_network(f"{address}/{a.prefixlen}", strict=False))
    return f"{address}/32"


def check_ephemeral_ports(ctx: Context) -> Iterator[Verdict]:
    seen, early = probed(ctx, "network", NetworkSeen.from_json)
    if seen is None:
        yield from [early] if early else []
        return
    by_name = {n.node: n for n in ctx.nodes}
    for name, reason in seen.errors.items():
        yield Verdict(Status.ERROR, name, f"{name}: the probe did not run: {reason}")
    for dst, listener in seen.listeners.items():
        if dst in seen.errors or listener.ports is None:
            continue
        into = seen.into(dst, own=False)
        if into:           # one node: no other node dials it
            yield _from_others(ctx, dst, listener, into, seen, by_name.get(dst))
        own = seen.into(dst, own=True)
        if own:            # more than one rank per node
            yield _own_path(dst, listener, own, seen.nproc_per_node, by_name.get(dst))


def _from_others(ctx: Context, dst: str, listener: Listener, into: list[Dial], seen: NetworkSeen,
                 node: NodeFacts | None) -> Verdict:
    """The other nodes dialling this node's ephemeral ports, judged in Gloo's direction."""
    blocked: dict[str, Dial] = {}
    for dial in into:
        if dial.blocks:
            blocked.setdefault(dial.src, dial)
    low, high = listener.range
    details = {"address": listener.address, "range": [low, high], "pairs": [d.to_json() for d in into],
               "turned_away": listener.rejected}
    if not blocked:
        sources = sorted({d.src for d in into})
        return Verdict(Status.PASS, dst, f"accepts new connections on its ephemeral ports ({low}-{high}) "
                       f"from {', '.join(sources)}", None, details)
    gloo_uses, broken = [], []
    for src, dial in blocked.items():
        theirs = seen.listeners.get(src)
        src_address = theirs.address if theirs else None
        order = _lower(listener.address or "", src_address) if src_address else None
        if dial.outcome == "unreachable" or order is None:
            broken.append(src)       # no path, or two address families: Gloo fails either way
        elif order:
            gloo_uses.append(src)    # the lower address listens, the higher connects (gloo Device::isInitiator)
    other = _other_end(ctx, dst, blocked)
    end = next((n for n in ctx.nodes if n.node == other), None)
    dead = dead_route(end) if end is not None else None
    got_nowhere = f"new connections to {dst}'s ephemeral ports from {', '.join(sorted(blocked))} get nowhere"
    if end is not None and dead is not None:
        # Not a firewall: one end's route to the other (the master) goes out a link that carries
        # nothing, so its packets (its dials, or its answers) go nowhere. Named on that node.
        route, why = dead
        role = "its answers to the master go nowhere" if end.node == dst else "its connections there go nowhere"
        return Verdict(Status.FAIL if gloo_uses or broken else Status.WARN, dst,
                       f"{got_nowhere}: {end.node}'s route to {route.address} goes out {route.interface}, which {why}: "
                       f"{role}", drop_route(end.node, route), {**details, "route": dict(route.sent)})
    rp = reverse_path_drop(ctx, seen, end.node, [d for d in into if d.blocks]) if end is not None else None
    if end is not None and rp is not None:
        # Not a firewall either: the worker's strict reverse-path filter drops what the master
        # sends it (its dials into the worker, or its answers to the worker's). Named on the worker.
        return Verdict(Status.FAIL if gloo_uses or broken else Status.WARN, dst,
                       f"{got_nowhere}: {rp.why(end.node)}{counted(seen, end.node)}", loosen_or_drop(end.node, rp),
                       {**details, **_reverse_path_details(rp, seen, end.node)})
    what = "; ".join(f"from {src}: {MEANING.get(d.outcome, d.outcome)}" for src, d in sorted(blocked.items()))
    address = listener.address or "?"
    subnet = _subnet(node, address) if node else address
    fix = run(f"on {dst}: sudo ufw allow from {subnet} proto tcp to any port {low}:{high}", dst,
              f"or nftables: sudo nft insert rule {_chain(node)} ip{'6' if ':' in subnet else ''} saddr {subnet} "
              f"tcp dport {low}-{high} accept")
    if broken:
        return Verdict(Status.FAIL, dst,
                       f"{dst}'s ephemeral ports at {listener.address} cannot be reached {what}: Gloo cannot "
                       "connect these nodes in either direction (see address-family and interface-choice)",
                       env_fix(ctx, dst, [("GLOO_SOCKET_IFNAME", "<the interface that reaches the others>")]),
                       details)
    if gloo_uses:
        return Verdict(Status.FAIL, dst,
                       f"new connections to {dst}'s ephemeral ports are blocked {what}. {dst} has the lower address, "
                       f"so it listens and {', '.join(sorted(gloo_uses))} "
                       f"{'connects' if len(gloo_uses) == 1 else 'connect'}: Gloo's process-group creation "
                       "hangs, then fails with 'Connect timeout' (seed 002)", fix, details)
    return Verdict(Status.WARN, dst,
                   f"new connections to {dst}'s ephemeral ports are blocked {what}. Gloo happens to connect "
                   f"the other way between these nodes (the lower address listens), but NCCL, more ranks or "
                   "new addresses can need this direction", fix, details)


def _other_end(ctx: Context, dst: str, blocked: dict[str, Dial]) -> str | None:
    """The one worker at the other end of every blocked path into `dst` from the master, or from
    it into the master: where a cause in its own routing (a dead route, a strict reverse-path
    filter) is looked for; None when the paths are not all between the master and one worker."""
    master = ctx.master.node
    found = {dst if src == master else src if dst == master else None for src in blocked}
    return found.pop() if len(found) == 1 and None not in found else None


def _chain(node: NodeFacts | None) -> str:
    """The node's nftables input chain for an accept rule ("inet filter input" unless its ruleset,
    read as root, names another)."""
    net = node.parsed.network if node is not None else None
    if net is None or isinstance(net, Missing) or isinstance(net.firewall, Missing):
        return "inet filter input"
    return net.firewall.input_chain


def _own_path(name: str, listener: Listener, dials: list[Dial], ranks: int, node: NodeFacts | None) -> Verdict:
    """The node dialling its own Gloo address, as its ranks do with each other. The connection
    never leaves the host, and Linux delivers it on lo even to the node's LAN address, so only
    the host's own input rules can block it: a firewall whose drop comes before any accept for
    lo (or for the node's own address)."""
    address, (low, high) = listener.address, listener.range
    path = f"{name} -> itself at {address}:{low}-{high}"
    details = {"path": "self", "address": address, "range": [low, high], "pairs": [d.to_json() for d in dials],
               "ranks_per_node": ranks}
    blocked = [d for d in dials if d.blocks]
    if not blocked:
        return Verdict(Status.PASS, name, f"{path}: new connections open (its {ranks} ranks connect to each other "
                       "there)", None, details)
    first = blocked[0]
    what = MEANING.get(first.outcome, first.outcome) + (f" ({first.detail})" if first.detail else "")
    summary = (f"{path}: new connections are {what}; its {ranks} ranks connect to each other there, so Gloo's "
               "process-group creation hangs, then fails in connectFullMesh ('Connect timeout')")
    if first.outcome not in ("filtered", "rejected", "refused"):
        return Verdict(Status.FAIL, name, summary, None, details)
    # The path never leaves the host: only its own input rules can stop it.
    ip = "ip6" if ":" in (address or "") else "ip"
    chain = _chain(node)
    fix = run(f"on {name}: sudo nft insert rule {chain} iif lo accept", name,
              f"its traffic to itself, to {address} too, arrives on lo; or for that address alone: sudo nft insert "
              f"rule {chain} {ip} saddr {address} {ip} daddr {address} accept; with ufw: sudo ufw allow in on lo")
    return Verdict(Status.FAIL, name, f"{summary}. The path never leaves {name}: its own firewall "
                   f"{'drops' if first.outcome == 'filtered' else 'rejects'} it", fix, details)
