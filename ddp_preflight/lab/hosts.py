"""Each node's /etc/hosts, /etc/hostname and /etc/resolv.conf (bind-mounted by `ip netns exec`)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from .addressing import vpn_ipv6_address
from .state import LabState, Node

ETC_NETNS = Path("/etc/netns")
STALE_HOST = 250       # stale-hosts' address: in the lab's subnet, held by no node (see addressing.py)


def stale_address(state: LabState) -> str:
    """Where a stale hosts line points: an address of the lab's subnet where nothing answers."""
    return str(ipaddress.ip_network(state.subnet4).network_address + STALE_HOST)


def render_hosts(state: LabState, node: Node) -> str:
    faults = {f.kind for f in state.faults if f.node == node.name}
    # stale-hosts@NODE:OTHER: OTHER's name (the master's when no PARAM) points at a dead address here.
    stale = {f.param or state.nodes[0].name for f in state.faults if f.node == node.name and f.kind == "stale-hosts"}
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    for other in state.nodes:
        address = other.ipv4
        if other.name == node.name and "loopback-host" in faults:
            address = "127.0.1.1"          # Debian's default: Gloo then binds loopback
        elif other.name == node.name and "vpn-ipv6" in faults:
            address = vpn_ipv6_address(other.ipv4)   # Gloo then binds IPv6
        elif other.name == node.name and "ipv6-host" in faults:
            address = other.ipv6                      # Gloo binds IPv6, on the LAN
        elif other.name in stale:
            address = stale_address(state)            # a machine that moved, its old line kept
        lines.append(f"{address}\t{other.name}")
    for other in state.nodes:
        lines.append(f"{other.ipv6}\t{other.name}-v6")
    return "\n".join(lines) + "\n"


def write_node_etc(state: LabState, node: Node) -> None:
    folder = ETC_NETNS / node.netns
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hosts").write_text(render_hosts(state, node))
    (folder / "hostname").write_text(node.name + "\n")
    # No name server is reachable from the lab: say so at once rather than let every
    # unknown name wait out a resolver timeout.
    (folder / "resolv.conf").write_text("# ddp-preflight lab: no DNS; names come from /etc/hosts\n"
                                        "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
