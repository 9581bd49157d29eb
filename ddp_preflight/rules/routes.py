"""The way each node reaches the master, and the interface its ranks should bind: the rule
interface-choice applies, which the launch pins and the probes bind (one rule for all three).
And the two ways a node's own routing loses the traffic of the master, or of a peer: a route out
a dead link, and an asymmetric path under a strict reverse-path filter; judged on the node's route
to the master (its facts' route_to_master) or on its route to a peer (what the network probe's
dials there reported), by one rule."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Protocol

from .facts import Interface, Missing, NetworkFacts, NodeFacts, Route
from .fix import Fix, change
from .fix import run as command_fix


class WithMaster(Protocol):
    """A run whose first node is the master (preflight's Context)."""
    @property
    def master(self) -> NodeFacts: ...


def route_to_master(node: NodeFacts) -> Route | Missing:
    """The route the node's kernel picks toward the master's address, as the node reported it."""
    network = node.parsed.network
    return network if isinstance(network, Missing) else network.route_to_master


MASTER = "the master"      # the other end in words, where it is the master


def dead_route(node: NodeFacts, route: Route | None = None) -> tuple[Route, str] | None:
    """The node's route to the master (or `route`, its route to a peer) goes out an interface that
    carries nothing: (the route, why in words). The kernel still picks it (a host route through a
    link that went down, a cable pulled: `linkdown`), so every connection there goes nowhere."""
    return dead_in(node.parsed.network, route_to_master(node) if route is None else route)


def dead_in(network: NetworkFacts | Missing, judged: Route | Missing) -> tuple[Route, str] | None:
    """dead_route on a machine's network facts and its route (the master's own, toward a node)."""
    if isinstance(network, Missing) or isinstance(judged, Missing) or not judged.interface:
        return None
    if "linkdown" in judged.flags:
        return judged, "has no carrier (the kernel marks the route linkdown)"
    iface = network.interface(judged.interface)
    if iface is not None and not iface.up:
        return judged, "is down"
    return None


def detour(node: NodeFacts, route: Route | None = None) -> tuple[Route, str, str] | None:
    """The node's route to the master (or `route`, to a peer) goes out another interface than the
    live one whose own subnet holds that address: a second interface whose route takes over (a
    VPN's, a stale host route through another link). Only a candidate: the caller needs the
    evidence that nothing sent that way arrives (the probe's dials all silently dropped)."""
    return detour_in(node.parsed.network, route_to_master(node) if route is None else route)


def detour_in(network: NetworkFacts | Missing, judged: Route | Missing) -> tuple[Route, str, str] | None:
    """detour on a machine's network facts and its route (the master's own, toward a node)."""
    if isinstance(network, Missing) or isinstance(judged, Missing) or not judged.interface or not judged.address:
        return None
    if network.interface_with(judged.address) is not None:
        return None        # its own address: the route to it is local (out lo), never a detour
    try:
        target = ipaddress.ip_address(judged.address)
    except ValueError:
        return None
    for iface in network.interfaces:
        if iface.name == judged.interface or not iface.up or iface.kind == "loopback":
            continue
        for a in iface.addresses:
            if a.prefixlen is None or a.scope == "link":
                continue
            subnet = ipaddress.ip_network(f"{a.address}/{a.prefixlen}", strict=False)
            if target.version == subnet.version and target in subnet and subnet.prefixlen < subnet.max_prefixlen:
                return judged, (f"takes over the route of {iface.name}, whose own subnet {subnet} holds "
                                f"{judged.address}"), iface.name
    return None


def drop_route(node: str, route: Route, peer: str = MASTER, instead: str | None = None) -> Fix:
    """Delete the route through the dead link (the next one, through the live LAN, then serves);
    one that is the default route is not deleted blind. `peer`: where the route leads, in words;
    `instead`: the live interface whose route then serves, where the link is not dead but leads
    elsewhere (no "bring it up" then)."""
    iface = route.interface
    if not route.prefix or route.prefix == "default":
        return change(f"on {node}: route {peer}'s address through {instead or 'a live interface'} (`ip route get "
                      f"{route.address}` there shows the route out {iface})" + ("" if instead else f"; or bring {iface} up"),
                      node)
    # A route policy routing picked from another table (`ip rule`) is deleted there: `ip route del`
    # looks in the main table alone, and would fail ("No such process").
    table = f" table {route.table}" if route.table else ""
    return command_fix(f"on {node}: sudo ip route del {route.prefix} dev {iface}{table}", node,
                       f"{peer} is then reached via {instead}" if instead else f"or bring {iface} up")


STRICT = 1     # rp_filter: 0 off, 1 strict (RFC 3704), 2 loose


@dataclass(frozen=True)
class ReversePathDrop:
    """A strict reverse-path filter on a node drops what the master (or a peer) sends it: the
    packets arrive on `arriving` (the interface holding `address`, where they are sent), while the
    node's route back to the sender goes out another interface, and a strict filter drops a packet
    that arrives on any interface but the one the route back to its sender uses."""
    route: Route                 # the node's route to the master, or to the peer
    arriving: Interface          # strict: its rp_filter, max(all, its own), is 1
    address: str                 # the node's address the master (the peer) sends to
    peer: str = MASTER           # the sender in words: "the master", or the peer's name

    def why(self, node: str) -> str:
        return (f"{node}'s route to {self.route.address} goes out {self.route.interface}, but what {self.peer} "
                f"sends to {self.address} arrives on {self.arriving.name}, whose reverse-path filter is strict "
                f"(rp_filter {STRICT}): {node} drops it")


def strict_reverse_path(node: NodeFacts, address: str | None, route: Route | None = None,
                        peer: str = MASTER) -> ReversePathDrop | None:
    """Whether the node's strict reverse-path filter drops what the master (or `peer`, the node's
    `route` leading to it) sends to its `address`: the interface holding that address is not the
    one its route back goes out, and its filter is strict. Facts only (loose mode, 2, and off, 0,
    never drop for this); whether it happened is the probe's to show. IPv4 only: Linux has no
    rp_filter for IPv6."""
    network, judged = node.parsed.network, route_to_master(node) if route is None else route
    if isinstance(network, Missing) or isinstance(judged, Missing) or judged.error or not judged.interface \
            or not judged.address or ":" in judged.address or not address or ":" in address:
        return None
    if network.interface_with(judged.address) is not None:
        return None        # the other end is this node itself: its route to its own address is local
    arriving = network.interface_with(address)
    if arriving is None or arriving.name == judged.interface or arriving.rp_filter != STRICT:
        return None
    return ReversePathDrop(judged, arriving, address, peer)


def loosen_or_drop(node: str, found: ReversePathDrop) -> Fix:
    """Make the path symmetric, or the filter loose, on the node. Deleting the route is the fix
    where the route that then serves goes out the interface the sender's packets arrive on (the
    main table's next one, as the node read it); else loose mode on that interface (max(all, its
    own) is then 2 whatever `all` says), which lets them in while the node answers out the other."""
    route, arriving = found.route, found.arriving.name
    # sysctl reads a dot as a level: a VLAN's eth0.10 is written eth0/10.
    loose = f"sudo sysctl -w net.ipv4.conf.{arriving.replace('.', '/')}.rp_filter=2"
    if route.prefix and route.prefix != "default" and route.table is None and route.then_interface == arriving:
        return command_fix(f"on {node}: sudo ip route del {route.prefix} dev {route.interface}", node,
                           f"{found.peer} is then reached via {arriving}, where its packets arrive; or keep the route, "
                           f"with {arriving} in loose mode: {loose}")
    return command_fix(f"on {node}: {loose}", node,
                       f"loose mode: {arriving} accepts what any route leads back from, while {node} answers out "
                       f"{route.interface}, which must reach {found.peer}; keep it in /etc/sysctl.d")


def toward_master(run: WithMaster, node: NodeFacts) -> Interface | None:
    """The interface this node uses to reach the master's address (the master: the one holding it)."""
    network, route = node.parsed.network, route_to_master(node)
    if isinstance(network, Missing) or isinstance(route, Missing):
        return None
    if node is run.master:
        owner = network.interface_with(route.address)
        if owner is not None:
            return owner
    return network.interface(route.interface)


def ifname_var(backend: str) -> str:
    """The variable that pins the interface a backend's ranks bind."""
    return "NCCL_SOCKET_IFNAME" if backend == "nccl" else "GLOO_SOCKET_IFNAME"


def pin_interface(backend: str, iface: str | None) -> str:
    """The pin in words: interface-choice's pass says it, and `ddp-preflight explain`'s fix on the
    ss_family error, which reads a run after the fact, with no options of its own to say --env."""
    return f"export {ifname_var(backend)}={iface or '<the LAN interface>'}"


def ipv6_off(node: NodeFacts, master: NodeFacts, address: str | None) -> tuple[str, Fix] | None:
    """The third way a node loses the master: the master's address is IPv6 and the node's IPv6 is
    disabled (net.ipv6.conf.all.disable_ipv6 = 1: the kernel has no IPv6 address or route there,
    so a connect says "Network is unreachable"). Its words and its fix: the master's IPv4 address
    on the interface that holds the IPv6 one, where it has one (nothing else to change on any
    node); else IPv6 turned back on there. None where that is not what the facts show."""
    network = node.parsed.network
    if not address or ":" not in address or isinstance(network, Missing):
        return None
    if network.disable_ipv6 == 1:
        why = (f"IPv6 is disabled on {node.node} (net.ipv6.conf.all.disable_ipv6 = 1), and the master's address "
               f"{address} is IPv6: {node.node} has no IPv6 route")
        enable = f"on {node.node}: sudo sysctl -w net.ipv6.conf.all.disable_ipv6=0 net.ipv6.conf.default.disable_ipv6=0"
    else:
        # Off on its interfaces one by one (net.ipv6.conf.eth0.disable_ipv6 = 1), none left with a
        # global IPv6 address: the same loss, turned back on where it was turned off.
        off = [i for i in network.interfaces if i.up and i.kind != "loopback" and i.disable_ipv6 == 1]
        if not off or any(a.family == 6 and a.scope == "global"
                          for i in network.interfaces if i.kind != "loopback" for a in i.addresses):
            return None
        names = ", ".join(i.name for i in off)
        why = (f"IPv6 is disabled on {node.node}'s {names} ("
               + ", ".join(f"net.ipv6.conf.{i.name}.disable_ipv6 = 1" for i in off)
               + f"), and the master's address {address} is IPv6: {node.node} has no IPv6 route")
        enable = f"on {node.node}: sudo sysctl -w " + " ".join(f"net.ipv6.conf.{i.name}.disable_ipv6=0" for i in off)
    theirs = master.parsed.network
    holder = None if isinstance(theirs, Missing) else theirs.interface_with(address)
    ipv4 = next((a.address for a in (holder.addresses if holder else ()) if a.family == 4 and a.scope != "host"),
                None)
    if ipv4 is None:
        return why, command_fix(enable, node.node, "its IPv6 addresses then come back from its network configuration "
                                                   "(SLAAC, or its static ones)")
    return why, change(f"give the master's IPv4 address on {holder.name if holder else 'that interface'}: "
                       f"--master-addr {ipv4} (MASTER_ADDR={ipv4} for torchrun)", None,
                       f"or turn IPv6 back on, {enable}, and its IPv6 addresses come back from its network "
                       "configuration")
