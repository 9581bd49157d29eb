"""master-reachable and ephemeral-ports: judged from what the network probe saw. Every path is
judged on its own: into a node from the other nodes, and from a node to itself (its ranks
connect to each other on its own address when it runs more than one)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Mapping

from ddp_preflight.rules.environment import env_fix
from ddp_preflight.rules.facts import Missing
from ddp_preflight.rules.fix import Fix, run
from ddp_preflight.rules.routes import detour, drop_route, ipv6_off

from ..model import Context, NodeFacts, Status, Verdict
from ..probes.network_seen import Dial, DialKind, Listener, NetworkSeen, gloo_listens
from .common import probed
from .name_cause import name_cause
from .reverse_path import unanswered
from .route_causes import RouteCause, route_cause

MEANING = {
    "filtered": "silently dropped (a firewall)",
    "rejected": "rejected (a firewall's REJECT rule)",
    "refused": "refused although the probe listened there (a REJECT rule with a TCP reset)",
    "unreachable": "unreachable (no route, or another address family)",
    "error": "failed",
}
# The ICMP "destination unreachable" codes a REJECT rule answers with ((family, code): words).
ICMP_CODES = {(4, 3): "port unreachable", (4, 9): "net prohibited", (4, 10): "host prohibited",
              (4, 13): "administratively prohibited", (6, 1): "administratively prohibited", (6, 4): "port unreachable"}


def meaning(d: Dial) -> str:
    """A dial's outcome in words; a refusal that came as an ICMP error (the node's REJECT rule
    without `with tcp reset`; nothing else answers a SYN with one) says so, not a TCP reset."""
    icmp = d.sent.get("icmp")
    if d.outcome == "refused" and isinstance(icmp, dict):
        code = ICMP_CODES.get((int(icmp.get("family", 4)), int(icmp.get("code", -1))),
                              f"type {icmp.get('type')} code {icmp.get('code')}")
        return f"refused although the probe listened there (a REJECT rule: it answered with ICMP {code})"
    return MEANING.get(d.outcome, d.outcome)


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
        said = f"cannot reach the master at {where}: {meaning(dial)}" + \
            (f" ({dial.detail})" if dial.detail else "")
        worker = next((n for n in ctx.nodes if n.node == dial.src), None)
        off = None if worker is None else ipv6_off(worker, ctx.master, dial.sent.get("resolved") or master.ip)
        if off is not None and dial.outcome == "unreachable":
            yield Verdict(Status.FAIL, dial.src, f"cannot reach the master at {where}: {off[0]}; rendezvous will time "
                          "out", off[1], details)
            continue
        named = name_cause(ctx.master, master, dial)
        if named is not None:
            # The worker's own resolution sends it elsewhere: a stale hosts line, or DNS.
            yield Verdict(Status.FAIL, dial.src, f"cannot reach the master at {where}: {named.why}; rendezvous "
                          "will time out", named.fix, {**details, **named.details})
            continue
        cause = route_cause(ctx, seen, dial.src, ctx.master.node, [dial])
        if cause is not None:
            # The cause is in one end's own routing (a route out a dead link, a strict reverse-path
            # filter on an asymmetric path), named there. Not the master's firewall.
            yield Verdict(Status.FAIL, dial.src, f"cannot reach the master at {where}: {cause.why}; rendezvous "
                          "will time out", cause.fix, {**details, **cause.details})
            continue
        fix = _open_port(ctx.master, port)
        if fix is None:
            said += (f"; the master's own firewall drops nothing on input (its ruleset, read as root), so the "
                     f"connection is lost on the way or on {dial.src} (`ip route get {master.address}` there shows "
                     "its route)")
        yield Verdict(Status.FAIL, dial.src, said + "; rendezvous will time out", fix, details)


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
        node = by_name.get(dst)
        other = seen.unpinned.get(dst)
        other = other if other is not None and other.ports is not None else None
        into = seen.into(dst, own=False)
        if into:           # one node: no other node dials it
            unpinned_into = seen.into(dst, own=False, unpinned=True) if other else []
            yield from _both_families(
                list(_from_others(ctx, dst, listener, into, seen, node, seen.listeners,
                                  name_family=bool(unpinned_into))),
                list(_from_others(ctx, dst, other, unpinned_into, seen, node, seen.unpinned, unpinned=True))
                if other and unpinned_into else None, listener, other)
        own = seen.into(dst, own=True)
        if own:            # more than one rank per node
            unpinned_own = seen.into(dst, own=True, unpinned=True) if other else []
            yield from _both_families(
                [_own_path(dst, listener, own, seen.ranks_on(dst), node)],
                [_own_path(dst, other, unpinned_own, seen.ranks_on(dst), node)] if other and unpinned_own else None,
                listener, other)


def _family(address: str | None) -> str:
    return "IPv6" if ":" in (address or "") else "IPv4"


def _both_families(pinned_results: list[Verdict], unpinned_results: list[Verdict] | None, listener: Listener,
                   other: Listener | None) -> list[Verdict]:
    """One path judged in both families its ranks may use: where the ranks bind once their
    interface is pinned (--launch, preflight's own jobs, the pin a fix gives) and where they bind
    unpinned (the other family on that interface: a torchrun started without GLOO_SOCKET_IFNAME).
    Both open: one pass naming both. One blocked: its verdict, saying the other is open; the
    pinned one blocked alone is a warning (the run as started works; the pin meets the block).
    Both blocked: both verdicts, each with its family's fix."""
    if not unpinned_results or other is None:
        return pinned_results
    if len(pinned_results) != 1 or len(unpinned_results) != 1:     # causes of a route's: each its own
        return pinned_results + [Verdict(v.status, v.node, v.summary, v.fix, {**v.details, "unpinned": True})
                                 for v in unpinned_results]
    pinned, unpinned = pinned_results[0], unpinned_results[0]
    here = f"{_family(listener.address)} {listener.address}"
    there = f"{_family(other.address)} {other.address}"
    if pinned.status is Status.PASS and unpinned.status is Status.PASS:
        return [Verdict(Status.PASS, pinned.node, f"{pinned.summary}, at {here} (where its ranks bind once their "
                        f"interface is pinned) and at {there} (where they bind unpinned)",
                        None, {**pinned.details, "unpinned": dict(unpinned.details)})]
    if pinned.status is Status.PASS:
        return [Verdict(unpinned.status, unpinned.node, f"{unpinned.summary}. Pinned, its ranks bind {here}, where "
                        "the same connections open", unpinned.fix, {**unpinned.details, "unpinned": True})]
    if unpinned.status is Status.PASS:
        status = Status.WARN if pinned.status is Status.FAIL else pinned.status
        return [Verdict(status, pinned.node, f"{pinned.summary}. A torchrun started without {_PIN} is not "
                        f"stopped: unpinned, its ranks bind {there}, where the same connections open; pinning "
                        "their interface (as --launch does, or a fix that sets it) meets this block",
                        pinned.fix, {**pinned.details, "unpinned": dict(unpinned.details)})]
    return [pinned, Verdict(unpinned.status, unpinned.node, unpinned.summary, unpinned.fix,
                            {**unpinned.details, "unpinned": True})]


_PIN = "GLOO_SOCKET_IFNAME"


def _from_others(ctx: Context, dst: str, listener: Listener, into: list[Dial], seen: NetworkSeen,
                 node: NodeFacts | None, listeners: Mapping[str, Listener], unpinned: bool = False,
                 name_family: bool = False) -> Iterator[Verdict]:
    """The other nodes dialling this node's ephemeral ports (on its `unpinned` address: where its
    ranks bind without a pin), judged in Gloo's direction: a blocked path whose cause is in one
    end's own routing is that cause's (one result per cause, on this node, with the fix on the
    node that has it); the rest, a firewall's. `name_family`: its address and family are said
    (the node's ranks use two)."""
    blocked: dict[str, Dial] = {}
    for dial in into:
        if dial.blocks:
            blocked.setdefault(dial.src, dial)
    low, high = listener.range
    details = {"address": listener.address, "range": [low, high], "pairs": [d.to_json() for d in into],
               "turned_away": listener.rejected}
    if not blocked:
        sources = sorted({d.src for d in into})
        yield Verdict(Status.PASS, dst, f"accepts new connections on its ephemeral ports ({low}-{high}) "
                      f"from {', '.join(sources)}", None, details)
        return
    gloo_uses, broken = [], []
    orders: dict[str, bool | None] = {}
    for src, dial in blocked.items():
        theirs = listeners.get(src)
        src_address = theirs.address if theirs else None
        order = orders[src] = gloo_listens(listener.address, src_address)
        if dial.outcome == "unreachable" or order is None:
            broken.append(src)       # no path, or two address families: Gloo fails either way
        elif order:
            gloo_uses.append(src)    # the lower address listens, the higher connects (gloo Device::isInitiator)
    at = f" at {listener.address} ({_family(listener.address)}: where its ranks bind unpinned, as its hostname " \
         "resolves)" if unpinned else \
        f" at {listener.address} ({_family(listener.address)}: where its ranks bind once their interface is " \
        "pinned)" if name_family else ""
    causes: dict[RouteCause, list[str]] = {}
    # A route's cause (a dead link, a strict reverse-path filter) is judged on the pinned paths:
    # the unpinned family's are firewall or reachability only (Linux filters no IPv6 reverse path).
    for src in [] if unpinned else sorted(blocked):
        cause = route_cause(ctx, seen, src, dst, [d for d in into if d.src == src and d.blocks])
        if cause is not None:
            causes.setdefault(cause, []).append(src)
    for cause, sources in causes.items():
        # Not a firewall: one end's own routing loses what it sends the other (a route out a dead
        # link, a strict reverse-path filter on an asymmetric path). Named on the node that has it.
        # Whether Gloo takes this direction decides, not how the dials went nowhere (dropped, or the
        # neighbour on the route's link never answered: the same route, seconds apart).
        yield Verdict(Status.FAIL if any(orders[s] is not False for s in sources) else Status.WARN, dst,
                      f"new connections to {dst}'s ephemeral ports from {', '.join(sources)} get nowhere: {cause.why}",
                      cause.fix, {**details, **cause.details})
        for src in sources:
            del blocked[src]
    if not blocked:
        return
    gloo_uses, broken = [s for s in gloo_uses if s in blocked], [s for s in broken if s in blocked]
    what = "; ".join(f"from {src}: {meaning(d)}{_part_open(into, src, (low, high))}"
                     for src, d in sorted(blocked.items()))
    address = listener.address or "?"
    subnet = _subnet(node, address) if node else address
    fix = run(f"on {dst}: sudo ufw allow from {subnet} proto tcp to any port {low}:{high}", dst,
              f"or nftables: sudo nft insert rule {_chain(node)} ip{'6' if ':' in subnet else ''} saddr {subnet} "
              f"tcp dport {low}-{high} accept")
    if broken and unpinned:
        # Unpinned ranks bind this family; pinned to the interface, they bind the other, probed apart.
        yield Verdict(Status.FAIL, dst,
                      f"{dst}'s ephemeral ports{at} cannot be reached {what}: unpinned, Gloo cannot connect "
                      "these nodes in either direction",
                      env_fix(ctx, dst, [(_PIN, listener.interface)]) if listener.interface else None, details)
    elif broken and (moved := _bound_out_detour(ctx, seen, node, listener)) is not None:
        # Its ranks bind the address of the interface its route to the master detours through (the
        # interface preflight pins follows that route): the others have no route there. One
        # cause, one fix: interface-choice and master-reachable name the same route.
        route, why, lan = moved
        yield Verdict(Status.FAIL, dst,
                      f"{dst}'s ephemeral ports at {listener.address} cannot be reached {what}: {dst}'s ranks bind "
                      f"{listener.address} on {route.interface} because its route to the master ({route.address}) "
                      f"goes out {route.interface}, which {why}", drop_route(dst, route, instead=lan),
                      {**details, "route": dict(route.sent)})
    elif broken:
        # Already the address its ranks bind pinned: a pin changes nothing, and no cause was seen
        # that a fix could name (not a route of its own, not a firewall: no connection got there).
        routes = "; ".join(f"`ip route get {address}` on {src} shows its route" for src in sorted(broken))
        yield Verdict(Status.FAIL, dst,
                      f"{dst}'s ephemeral ports at {listener.address} cannot be reached {what}: Gloo cannot "
                      f"connect these nodes in either direction ({routes}; see address-family and interface-choice)",
                      None, details)
    elif gloo_uses:
        yield Verdict(Status.FAIL, dst,
                      f"new connections to {dst}'s ephemeral ports{at} are blocked {what}. {dst} has the lower address, "
                      f"so it listens and {', '.join(sorted(gloo_uses))} "
                      f"{'connects' if len(gloo_uses) == 1 else 'connect'}: Gloo's process-group creation "
                      f"{_gloo_fails(blocked[sorted(gloo_uses)[0]])}", fix, details)
    else:
        yield Verdict(Status.WARN, dst,
                      f"new connections to {dst}'s ephemeral ports{at} are blocked {what}. Gloo happens to connect "
                      f"the other way between these nodes (the lower address listens), but NCCL, more ranks or "
                      "new addresses can need this direction", fix, details)


def _bound_out_detour(ctx: Context, seen: NetworkSeen, node: NodeFacts | None, listener: Listener):
    """The node's route to the master detours out a second interface (rules/routes.detour), the
    one its listener (where its ranks bind) is on, and nothing the node sent the master out
    there was answered: (route, why, the LAN interface), else None."""
    if node is None or node is ctx.master or listener.interface is None:
        return None
    taken = detour(node)
    if taken is None or taken[0].interface != listener.interface or not unanswered(seen, node.node, ctx.master.node):
        return None
    return taken


def _part_open(into: list[Dial], src: str, span: tuple[int, int]) -> str:
    """Where only part of the range opens from `src` (the listener's ports spread across it, some
    opened, some not): which of the ports tried opened, as spans of neighbouring ports tried."""
    tried = sorted({(d.port, d.outcome == "open") for d in into if d.src == src and d.sent.get("spread")})
    opened = [port for port, ok in tried if ok]
    if not opened or len(opened) == len(tried):
        return ""
    spans, run_ = [], [tried[0]]
    for one in tried[1:]:
        if one[1] == run_[-1][1]:
            run_.append(one)
        else:
            spans.append(run_)
            run_ = [one]
    spans.append(run_)
    said = ", ".join(f"{r[0][0]}-{r[-1][0]}" if len(r) > 1 else str(r[0][0]) for r in spans if r[0][1])
    return (f", only part of the range: {len(opened)} of the {len(tried)} ports tried across {span[0]}-{span[1]} "
            f"opened ({said}), so Gloo's ports, which the kernel picks anywhere in it, connect or not by chance")


def _gloo_fails(dial: Dial, mesh: bool = False) -> str:
    """How Gloo's process-group creation ends on this blocked path, in its own words: a silent
    drop waits out its timeout ('Connect timeout', seed 002); a REJECT answers at once, with the
    error the kernel gave the connect (a reset or port-unreachable: 'Connection refused')."""
    if dial.outcome == "filtered":
        how, said = "hangs, then fails", "Connect timeout"
    elif dial.outcome == "refused":
        how, said = "fails", "Connection refused"
    else:
        how, said = "fails", (dial.detail or "").split(": ", 1)[-1]
    if not said:
        return how
    return f"{how} in connectFullMesh ('{said}')" if mesh else \
        f"{how} with '{said}'"


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
    what = meaning(first) + (f" ({first.detail})" if first.detail else "")
    summary = (f"{path}: new connections are {what}; its {ranks} ranks connect to each other there, so Gloo's "
               f"process-group creation {_gloo_fails(first, mesh=True)}")
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
