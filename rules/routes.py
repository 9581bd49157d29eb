"""The way each node reaches the master, and the interface its ranks should bind: the rule
interface-choice applies, which the launch pins and the probes bind (one rule for all three)."""

from __future__ import annotations

from typing import Protocol

from .facts import Interface, Missing, NodeFacts, Route


class WithMaster(Protocol):
    """A run whose first node is the master (preflight's Context)."""
    @property
    def master(self) -> NodeFacts: ...


def route_to_master(node: NodeFacts) -> Route | Missing:
    """The route the node's kernel picks toward the master's address, as the node reported it."""
    network = node.parsed.network
    return network if isinstance(network, Missing) else network.route_to_master


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
