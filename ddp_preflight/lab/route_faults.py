"""The lab's route faults: a second interface and a host route through it that beats the LAN's
(dead-route: no carrier; wrong-route: up, leading nowhere; rp-filter: a direct link the node's
strict reverse-path filter drops what comes back over). Each returns its undo records."""

from __future__ import annotations

from .errors import LabError
from .state import LabState, Node
from .system import ip_batch, run

DEAD_IFACE = "eth1"


def toward(state: LabState, node: Node, param: str | None, fault: str) -> Node:
    """The node a route fault leads toward: the peer its param names, else the master."""
    target = state.nodes[0] if param is None else next((n for n in state.nodes if n.name == param), None)
    if target is None:
        raise LabError(f"{fault}@{node.name}:{param}: no node {param!r} in this lab "
                       f"({', '.join(n.name for n in state.nodes)})")
    if target.name == node.name:
        raise LabError(f"{fault}@{node.name}: a node's route to itself is local, not one; give a worker and another "
                       f"node, e.g. {fault}@worker1 (toward the master) or {fault}@worker1:worker2")
    return target


def dead_route(state: LabState, node: Node, param: str | None) -> list[dict]:
    # A second interface whose link is gone (a veth whose other end is down: no carrier), and a
    # host route to the master (or the peer PARAM names) through it, as a stale VPN or a pulled
    # cable leaves one: the kernel still picks it (linkdown), and every connection there goes nowhere.
    target = toward(state, node, param, "dead-route")
    ip_batch([f"link add {DEAD_IFACE} type veth peer name {DEAD_IFACE}p",
              f"link set {DEAD_IFACE} up",
              f"route add {target.ipv4}/32 dev {DEAD_IFACE}"], netns=node.netns)
    return [{"kind": "link", "netns": node.netns, "name": DEAD_IFACE}]


RP_IFACE = "eth1"


def wrong_route(state: LabState, node: Node, param: str | None) -> list[dict]:
    # A second interface that is up and carries (a veth whose other end is up, in the node too,
    # where nothing answers: a VPN's or another network's link), and a host route to the master
    # (or the peer PARAM names) through it, which takes over the LAN's: what the node sends there
    # never arrives.
    target = toward(state, node, param, "wrong-route")
    if any(f.node == node.name and f.kind in ("dead-route", "rp-filter") for f in state.faults):
        raise LabError(f"wrong-route@{node.name}: another fault holds {DEAD_IFACE} there; clear it first")
    undo = [{"kind": "link", "netns": node.netns, "name": DEAD_IFACE}]      # its other end goes with it
    ip_batch([f"link add {DEAD_IFACE} type veth peer name {DEAD_IFACE}p",
              f"link set {DEAD_IFACE} addrgenmode none", f"link set {DEAD_IFACE}p addrgenmode none",
              f"link set {DEAD_IFACE}p up", f"link set {DEAD_IFACE} up",
              f"route add {target.ipv4}/32 dev {DEAD_IFACE}"], netns=node.netns)
    return undo


def rp_filter(state: LabState, node: Node, param: str | None) -> list[dict]:
    # A direct cable from the node to the master, or to the peer PARAM names (eth1, a veth whose
    # other end is in that node, up, carrying), and a host route to it through that cable on the
    # node alone: the node sends to it over the cable while it still reaches the node on the LAN
    # (eth0). A strict reverse-path filter on the node drops all it sends there (its ARP requests
    # too): the route back to the sender goes out eth1. Loose mode, or the route gone, lets it through.
    target = toward(state, node, param, "rp-filter")
    if any(f.node == node.name and f.kind == "dead-route" for f in state.faults):
        raise LabError(f"rp-filter@{node.name}: dead-route@{node.name} holds {RP_IFACE} there; clear it first")
    keys = ["net.ipv4.conf.all.rp_filter", f"net.ipv4.conf.{node.iface}.rp_filter"]
    undo = [{"kind": "sysctl", "netns": node.netns, "key": key, "value": sysctl_value(node.netns, key)} for key in keys]
    peer = f"to-{node.name}"[:15]
    undo.append({"kind": "link", "netns": node.netns, "name": RP_IFACE})     # its other end goes with it
    ip_batch([f"link add {RP_IFACE} type veth peer name {peer} netns {target.netns}"], netns=node.netns)
    try:
        # No addresses on the link (no IPv6 link-local either): the node sends from its LAN address.
        ip_batch([f"link set {RP_IFACE} addrgenmode none", f"link set {RP_IFACE} up",
                  f"route add {target.ipv4}/32 dev {RP_IFACE}"], netns=node.netns)
        ip_batch([f"link set {peer} addrgenmode none", f"link set {peer} up"], netns=target.netns)
        run(["ip", "netns", "exec", node.netns, "sysctl", "-q", "-w",
             *(f"{key}=1" for key in keys), f"net.ipv4.conf.{RP_IFACE}.rp_filter=1"])
    except LabError:       # what was made goes again, so the fault is all there or not at all
        run(["ip", "-n", node.netns, "link", "del", RP_IFACE], check=False)
        run(["ip", "netns", "exec", node.netns, "sysctl", "-q", "-w",
             *(f"{r['key']}={r['value']}" for r in undo if r["kind"] == "sysctl")], check=False)
        raise
    return undo


def sysctl_value(netns: str, key: str) -> str:
    return run(["ip", "netns", "exec", netns, "sysctl", "-n", key]).stdout.strip()
