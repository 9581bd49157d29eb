"""address-family and interface-choice: what Gloo binds on each node, and the link it uses."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

from ..model import Context, NodeFacts, Result, Status
from .common import interface, interface_with_address, network_of

FAMILY = {4: "IPv4", 6: "IPv6"}


def toward_master(ctx: Context, node: NodeFacts) -> dict | None:
    """The interface this node uses to reach the master's address (the master: the one holding it)."""
    route = network_of(node).get("route_to_master") or {}
    if node is ctx.master:
        owner = interface_with_address(node, route.get("address"))
        if owner is not None:
            return owner
    return interface(node, route.get("interface"))


def _is_loopback(address: str | None) -> bool:
    try:
        return address is not None and ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def _pin(ctx: Context, iface: str) -> str:
    var = "NCCL_SOCKET_IFNAME" if ctx.options.backend == "nccl" else "GLOO_SOCKET_IFNAME"
    return f"export {var}={iface}"


def _reference_family(ctx: Context) -> int | None:
    """The family workers dial the master with; else the master's own bind family."""
    # The master's own route first; any node's when the master's facts are missing.
    for node in (ctx.master, *ctx.reachable):
        address = (network_of(node).get("route_to_master") or {}).get("address")
        if address:
            return 6 if ":" in address else 4
    return (network_of(ctx.master).get("gloo_bind") or {}).get("family")


def check_address_family(ctx: Context) -> Iterator[Result]:
    ID = "address-family"
    multi = len(ctx.nodes) > 1
    reference = _reference_family(ctx)
    for node in ctx.reachable:
        bind = network_of(node).get("gloo_bind")
        if not bind:
            yield Result(ID, Status.ERROR, node.node, f"{node.node}: {node.section_error('network') or 'no network facts'}")
            continue
        iface = toward_master(ctx, node)
        pin = _pin(ctx, iface["name"]) if iface else "export GLOO_SOCKET_IFNAME=<the LAN interface>"
        where = f"{bind.get('address')} on {bind.get('interface') or '?'}"
        why = {"GLOO_SOCKET_IFNAME": "set by GLOO_SOCKET_IFNAME",
               "hostname": f"its hostname {bind.get('hostname')} resolves to it",
               "fallback": f"its hostname {bind.get('hostname')} resolves to nothing bindable"}[bind["source"]]
        details = {"bind": dict(bind), "reference_family": reference}
        if bind.get("error"):
            yield Result(ID, Status.FAIL, node.node, f"{node.node}: {bind['error']}", pin, details)
        elif multi and _is_loopback(bind.get("address")):
            yield Result(ID, Status.FAIL, node.node,
                         f"Gloo on {node.node} will bind loopback {where} ({why}); other nodes cannot reach it",
                         f"{pin}   # on {node.node}; or map {bind.get('hostname')} to its LAN address in /etc/hosts",
                         details)
        elif multi and reference and bind.get("family") != reference:
            yield Result(ID, Status.FAIL, node.node,
                         f"Gloo on {node.node} will bind {FAMILY[bind['family']]} {where} ({why}) while the "
                         f"master is reached over {FAMILY[reference]}: process-group creation fails with "
                         f"'ss1.ss_family == ss2.ss_family. {10 if bind['family'] == 6 else 2} vs "
                         f"{10 if reference == 6 else 2}'",
                         f"{pin}   # on {node.node}", details)
        else:
            yield Result(ID, Status.PASS, node.node,
                         f"Gloo binds {FAMILY.get(bind.get('family'), '?')} {where} ({why})", None, details)


KIND_WARNINGS = {
    "wireless": "Wi-Fi: every step's all-reduce crosses it, and its rate and latency bound the run "
                "(seeds 001, 004); use a wired link",
    "vpn": "a VPN tunnel: extra latency and encryption on every collective; use the LAN interface",
    "docker/bridge": "a container bridge: peers outside this host may not reach it",
}


def check_interface_choice(ctx: Context) -> Iterator[Result]:
    ID = "interface-choice"
    if len(ctx.nodes) < 2:
        yield Result(ID, Status.SKIP, None, "one node: no interface between nodes to choose")
        return
    if ctx.options.master_addr is None:
        yield Result(ID, Status.SKIP, None, "not checked: the master's address is not known (it was not reached)",
                     "pass --master-addr ADDR, or fix the master's ssh access")
        return
    for node in ctx.reachable:
        net = network_of(node)
        route = net.get("route_to_master") or {}
        iface = toward_master(ctx, node)
        if iface is None:
            reason = route.get("error") or f"no interface of {node.node} reaches {route.get('target', 'the master')}"
            yield Result(ID, Status.FAIL, node.node, f"{node.node}: {reason}",
                         f"check that {node.node} and the master share a network (ip route get "
                         f"{route.get('address') or route.get('target') or 'MASTER'})", {"route": dict(route)})
            continue
        name, kind = iface["name"], iface["kind"]
        who = "the master is reached" if node is ctx.master else f"{node.node} reaches the master"
        speed = f", {iface['speed_mbit']} Mbit/s" if iface.get("speed_mbit") else ""
        env = {("NCCL_SOCKET_IFNAME" if ctx.options.backend == "nccl" else "GLOO_SOCKET_IFNAME"): name}
        details = {"interface": name, "kind": kind, "speed_mbit": iface.get("speed_mbit"),
                   "env": env, "route": dict(route)}
        bind = net.get("gloo_bind") or {}
        pin = _pin(ctx, name)
        if ctx.options.backend == "gloo" and bind.get("interface") and bind.get("interface") != name:
            same_family = bind.get("family") == (6 if ":" in (route.get("address") or "") else 4)
            yield Result(ID, Status.FAIL if same_family else Status.WARN, node.node,
                         f"{who} via {name} ({kind}) but Gloo would bind "
                         f"{bind.get('interface')} ({bind.get('address') or 'no address'})"
                         + ("" if same_family else "; see address-family")
                         + (f"; and {name} is {KIND_WARNINGS[kind]}" if kind in KIND_WARNINGS else ""),
                         f"{pin}   # on {node.node}", details)
        elif kind in KIND_WARNINGS:
            yield Result(ID, Status.WARN, node.node,
                         f"{who} over {name}, {KIND_WARNINGS[kind]}",
                         f"{pin}   # on {node.node}, if this link is the one to use", details)
        else:
            yield Result(ID, Status.PASS, node.node,
                         f"{who} via {name} ({kind}{speed}); pin it with {pin}", None, details)
