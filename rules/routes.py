"""The way each node reaches the master, and the interface its ranks should bind: the rule
interface-choice applies, which the launch pins and the probes bind (one rule for all three).
And the two ways a node's own routing loses the master's traffic: a route out a dead link, and
an asymmetric path under a strict reverse-path filter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .facts import Interface, Missing, NodeFacts, Route
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


def dead_route(node: NodeFacts) -> tuple[Route, str] | None:
    """The node's route to the master goes out an interface that carries nothing: (the route,
    why in words). The kernel still picks it (a host route through a link that went down, a cable
    pulled: `linkdown`), so every connection to the master from there goes nowhere."""
    network, route = node.parsed.network, route_to_master(node)
    if isinstance(network, Missing) or isinstance(route, Missing) or not route.interface:
        return None
    if "linkdown" in route.flags:
        return route, "has no carrier (the kernel marks the route linkdown)"
    iface = network.interface(route.interface)
    if iface is not None and not iface.up:
        return route, "is down"
    return None


def drop_route(node: str, route: Route) -> Fix:
    """Delete the route through the dead link (the next one, through the live LAN, then serves);
    one that is the default route is not deleted blind."""
    iface = route.interface
    if not route.prefix or route.prefix == "default":
        return change(f"on {node}: route the master's address through a live interface (`ip route get "
                      f"{route.address}` there shows the route out {iface}); or bring {iface} up", node)
    return command_fix(f"on {node}: sudo ip route del {route.prefix} dev {iface}", node, f"or bring {iface} up")


STRICT = 1     # rp_filter: 0 off, 1 strict (RFC 3704), 2 loose


@dataclass(frozen=True)
class ReversePathDrop:
    """A strict reverse-path filter on a node drops what the master sends it: the packets arrive
    on `arriving` (the interface holding `address`, where they are sent), while the node's route
    back to the master goes out another interface, and a strict filter drops a packet that arrives
    on any interface but the one the route back to its sender uses."""
    route: Route                 # the node's route to the master
    arriving: Interface          # strict: its rp_filter, max(all, its own), is 1
    address: str                 # the node's address the master sends to

    def why(self, node: str) -> str:
        return (f"{node}'s route to {self.route.address} goes out {self.route.interface}, but what the master "
                f"sends to {self.address} arrives on {self.arriving.name}, whose reverse-path filter is strict "
                f"(rp_filter {STRICT}): {node} drops it")


def strict_reverse_path(node: NodeFacts, address: str | None) -> ReversePathDrop | None:
    """Whether the node's strict reverse-path filter drops what the master sends to its `address`:
    the interface holding that address is not the one its route to the master goes out, and its
    filter is strict. Facts only (loose mode, 2, and off, 0, never drop for this); whether it
    happened is the probe's to show. IPv4 only: Linux has no rp_filter for IPv6."""
    network, route = node.parsed.network, route_to_master(node)
    if isinstance(network, Missing) or isinstance(route, Missing) or route.error or not route.interface \
            or not route.address or ":" in route.address or not address or ":" in address:
        return None
    if network.interface_with(route.address) is not None:
        return None        # the master itself: its route to its own address is local
    arriving = network.interface_with(address)
    if arriving is None or arriving.name == route.interface or arriving.rp_filter != STRICT:
        return None
    return ReversePathDrop(route, arriving, address)


def loosen_or_drop(node: str, found: ReversePathDrop) -> Fix:
    """Make the path symmetric, or the filter loose, on the node. Deleting the route is the fix
    where the route that then serves goes out the interface the master's packets arrive on (the
    main table's next one, as the node read it); else loose mode on that interface (max(all, its
    own) is then 2 whatever `all` says), which lets them in while the node answers out the other."""
    route, arriving = found.route, found.arriving.name
    # sysctl reads a dot as a level: a VLAN's eth0.10 is written eth0/10.
    loose = f"sudo sysctl -w net.ipv4.conf.{arriving.replace('.', '/')}.rp_filter=2"
    if route.prefix and route.prefix != "default" and route.table is None and route.then_interface == arriving:
        return command_fix(f"on {node}: sudo ip route del {route.prefix} dev {route.interface}", node,
                           f"the master is then reached via {arriving}, where its packets arrive; or keep the route, "
                           f"with {arriving} in loose mode: {loose}")
    return command_fix(f"on {node}: {loose}", node,
                       f"loose mode: {arriving} accepts what any route leads back from, while {node} answers out "
                       f"{route.interface}, which must reach the master; keep it in /etc/sysctl.d")


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
