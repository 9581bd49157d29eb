"""The way each node reaches the master, and the interface its ranks should bind: the rule
interface-choice applies, which the launch pins and the probes bind (one rule for all three)."""

from __future__ import annotations

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
