"""address-family and interface-choice: what Gloo binds on each node, and the link it uses."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

from ddp_preflight.rules.environment import env_fix
from ddp_preflight.rules.facts import Interface, Missing, NodeFacts, Route
from ddp_preflight.rules.fix import Fix, change
from ddp_preflight.rules.routes import (
    dead_route,
    detour,
    drop_route,
    ifname_var,
    ipv6_off,
    loosen_or_drop,
    pin_interface,
    route_to_master,
    toward_master,
)

from ..model import Context, Status, Verdict
from .reverse_path import counted, network_seen, reverse_path_drop, unanswered

FAMILY = {4: "IPv4", 6: "IPv6"}


def _is_loopback(address: str | None) -> bool:
    try:
        return address is not None and ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def _pin(ctx: Context, node: NodeFacts, iface: Interface | None, note: str = "") -> Fix | None:
    """The fix that makes `node`'s ranks bind the interface that reaches the others (address-family,
    interface-choice), for every node at once where each reaches the master on the same name.
    None where that interface is not known: a fix names it, or there is none."""
    if iface is None:
        return None
    var = ifname_var(ctx.options.backend)
    names = {i.name if (i := toward_master(ctx, n)) else None for n in ctx.reachable}
    return env_fix(ctx, node.node, [(var, iface.name)], every_node=names == {iface.name}, note=note)


def _families(ctx: Context) -> dict[str, int]:
    """The address family each reachable node's ranks will bind for Gloo (a bind known, usable)."""
    out = {}
    for node in ctx.reachable:
        network = node.parsed.network
        bind = network if isinstance(network, Missing) else network.gloo_bind
        if not isinstance(bind, Missing) and not bind.error and bind.family and not _is_loopback(bind.address):
            out[node.node] = bind.family
    return out


def _reference_family(ctx: Context, families: dict[str, int]) -> tuple[int | None, str]:
    """The family the other ranks bind, and whose it is: rank 0's node (the master) when its bind
    is known; else the one most nodes bind (None on a tie: who is odd cannot be told)."""
    if ctx.master.node in families:
        return families[ctx.master.node], ctx.master.node
    counts = sorted({f: list(families.values()).count(f) for f in families.values()}.items(), key=lambda c: -c[1])
    if not counts or len(counts) > 1 and counts[0][1] == counts[1][1]:
        return None, ""
    return counts[0][0], "most nodes"


def _route_family(ctx: Context) -> int | None:
    """The family the workers dial the master with (the store's connection), from any node's route."""
    for node in (ctx.master, *ctx.reachable):
        route = route_to_master(node)
        if not isinstance(route, Missing) and route.address:
            return 6 if ":" in route.address else 4
    return None


def check_address_family(ctx: Context) -> Iterator[Verdict]:
    """As Gloo judges it: each rank's device binds one address (GLOO_SOCKET_IFNAME's, else its
    hostname's), the ranks exchange these through the store, and every pair connects device to
    device; two ends of different families fail process-group creation (gloo's tcp/device.cc:
    'ss1.ss_family == ss2.ss_family. 10 vs 2'). The master address's family is the store's
    connection, not a pair's: nodes that all bind IPv6 behind an IPv4 MASTER_ADDR train."""
    multi = len(ctx.nodes) > 1
    families = _families(ctx)
    reference, whose = _reference_family(ctx, families)
    for node in ctx.reachable:
        network = node.parsed.network
        bind = network if isinstance(network, Missing) else network.gloo_bind
        if isinstance(bind, Missing):
            yield Verdict(Status.ERROR, node.node, f"{node.node}: {bind.reason}")
            continue
        iface = toward_master(ctx, node)
        where = f"{bind.address} on {bind.interface or '?'}"
        why = {"GLOO_SOCKET_IFNAME": "set by GLOO_SOCKET_IFNAME",
               "hostname": f"its hostname {bind.hostname} resolves to it",
               "fallback": f"its hostname {bind.hostname} resolves to nothing bindable"}[bind.source]
        details = {"bind": bind.to_json(), "reference_family": reference, "families": families}
        differ = multi and len(set(families.values())) > 1 and node.node in families
        if bind.error:
            yield Verdict(Status.FAIL, node.node, f"{node.node}: {bind.error}", _pin(ctx, node, iface), details)
        elif multi and _is_loopback(bind.address):
            yield Verdict(Status.FAIL, node.node,
                          f"Gloo on {node.node} will bind loopback {where} ({why}); other nodes cannot reach it",
                          _pin(ctx, node, iface, f"or map {bind.hostname} to its LAN address in /etc/hosts"),
                          details)
        elif differ and reference is None:
            listed = ", ".join(f"{name} {FAMILY.get(f, '?')}" for name, f in families.items())
            yield Verdict(Status.FAIL, node.node,
                          f"Gloo's ranks will bind different address families ({listed}), and which node is odd "
                          f"cannot be told without the master's: {node.node} binds {where} ({why}); pairs of two "
                          "families fail process-group creation with 'ss1.ss_family == ss2.ss_family'",
                          _pin(ctx, node, iface), details)
        elif differ and bind.family != reference:
            others = whose if whose == "most nodes" else f"{whose}'s ranks"
            yield Verdict(Status.FAIL, node.node,
                          f"Gloo on {node.node} will bind {FAMILY.get(bind.family or 0, '?')} {where} ({why}) while "
                          f"{others} bind {FAMILY.get(reference or 0, '?')}: every pair of ranks connects these addresses, and "
                          f"process-group creation fails with 'ss1.ss_family == ss2.ss_family. "
                          f"{10 if bind.family == 6 else 2} vs {10 if reference == 6 else 2}'",
                          _pin(ctx, node, iface), details)
        elif multi and ctx.master.node not in families and node.node != ctx.master.node and \
                (dialled := _route_family(ctx)) and bind.family != dialled:
            # The master's own bind is not known (not reached): what is known is the family the
            # master is reached with, which its ranks bind unless its hostname says otherwise.
            yield Verdict(Status.WARN, node.node,
                          f"Gloo on {node.node} will bind {FAMILY.get(bind.family or 0, '?')} {where} ({why}); the "
                          f"master's ranks' family is not known (its facts are missing), and the master is reached "
                          f"over {FAMILY[dialled]}: if its ranks bind {FAMILY[dialled]}, process-group creation fails "
                          f"with 'ss1.ss_family == ss2.ss_family. {10 if bind.family == 6 else 2} vs "
                          f"{10 if dialled == 6 else 2}'", _pin(ctx, node, iface), details)
        else:
            yield Verdict(Status.PASS, node.node,
                          f"Gloo binds {FAMILY.get(bind.family or 0, '?')} {where} ({why})", None, details)


KIND_WARNINGS = {
    "wireless": "Wi-Fi: every step's all-reduce crosses it, and its rate and latency bound the run; "
                "use a wired link",
    "vpn": "a VPN tunnel: extra latency and encryption on every collective; use the LAN interface",
    "docker/bridge": "a container bridge: peers outside this host may not reach it",
}


def check_interface_choice(ctx: Context) -> Iterator[Verdict]:
    if len(ctx.nodes) < 2:
        yield Verdict(Status.SKIP, None, "one node: no interface between nodes to choose")
        return
    if ctx.options.master_addr is None:
        yield Verdict(Status.SKIP, None, "not checked: the master's address is not known (it was not reached)",
                      change("pass --master-addr ADDR, or fix the master's ssh access"))
        return
    seen = network_seen(ctx)     # where the network probe ran: the paths it found dropped
    for node in ctx.reachable:
        route = route_to_master(node)
        target, address = (None, None) if isinstance(route, Missing) else (route.target, route.address)
        dead = dead_route(node)
        if dead is not None and node is not ctx.master:
            # Its route to the master goes out a link that carries nothing: pinning that link would
            # pin the dead one; the route is the fault (master-reachable says the same, one fix).
            picked, why = dead
            yield Verdict(Status.FAIL, node.node,
                          f"{node.node}'s route to the master ({picked.address}) goes out {picked.interface}, which "
                          f"{why}: no interface to pin until it is gone", drop_route(node.node, picked),
                          {"route": _route_json(route)})
            continue
        rp = None if seen is None else \
            reverse_path_drop(ctx, seen, node.node, seen.blocked({node.node, ctx.master.node}))
        if seen is not None and rp is not None:
            # The paths between it and the master are asymmetric under a strict reverse-path filter,
            # and the probe saw them dropped: pinning either interface would not help (master-reachable
            # and ephemeral-ports say the same, one fix).
            yield Verdict(Status.FAIL, node.node,
                          f"{rp.why(node.node)}{counted(seen, node.node)}; the probe's connections between "
                          f"{node.node} and the master got nowhere: no interface to pin until the paths agree",
                          loosen_or_drop(node.node, rp), {"route": _route_json(route)})
            continue
        taken = detour(node) if seen is not None and node is not ctx.master else None
        if taken is not None and seen is not None and unanswered(seen, node.node, ctx.master.node):
            # A live second interface's route takes over the LAN's, and nothing the node sent the
            # master out there arrived: pinning either interface would not help (master-reachable,
            # one fix).
            picked, why, lan = taken
            yield Verdict(Status.FAIL, node.node,
                          f"{node.node}'s route to the master ({picked.address}) goes out {picked.interface}, which "
                          f"{why}; the probe's connections between {node.node} and the master got nowhere: no "
                          "interface to pin until it is gone", drop_route(node.node, picked, instead=lan),
                          {"route": _route_json(route)})
            continue
        iface = toward_master(ctx, node)
        off = ipv6_off(node, ctx.master, address or target) if iface is None else None
        if off is not None:
            yield Verdict(Status.FAIL, node.node, f"{node.node}: {off[0]}", off[1], {"route": _route_json(route)})
            continue
        if iface is None:
            reason = (None if isinstance(route, Missing) else route.error) or \
                f"no interface of {node.node} reaches {target or 'the master'}"
            yield Verdict(Status.FAIL, node.node, f"{node.node}: {reason}",
                          change(f"check that {node.node} and the master share a network (ip route get "
                                 f"{address or target or 'MASTER'})", node.node), {"route": _route_json(route)})
            continue
        name, kind = iface.name, iface.kind
        who = "the master is reached" if node is ctx.master else f"{node.node} reaches the master"
        speed = f", {iface.speed_mbit} Mbit/s" if iface.speed_mbit else ""
        env = {ifname_var(ctx.options.backend): name}
        details = {"interface": name, "kind": kind, "speed_mbit": iface.speed_mbit,
                   "env": env, "route": _route_json(route)}
        network = node.parsed.network
        bind = None if isinstance(network, Missing) or isinstance(network.gloo_bind, Missing) else network.gloo_bind
        if ctx.options.backend == "gloo" and bind and bind.interface and bind.interface != name:
            same_family = bind.family == (6 if ":" in (address or "") else 4)
            yield Verdict(Status.FAIL if same_family else Status.WARN, node.node,
                          f"{who} via {name} ({kind}) but Gloo would bind "
                          f"{bind.interface} ({bind.address or 'no address'})"
                          + ("" if same_family else "; see address-family")
                          + (f"; and {name} is {KIND_WARNINGS[kind]}" if kind in KIND_WARNINGS else ""),
                          # One cause, one fix: address-family's words for a loopback bind.
                          _pin(ctx, node, iface, f"or map {bind.hostname} to its LAN address in /etc/hosts"
                               if _is_loopback(bind.address) and bind.hostname else ""), details)
        elif kind in KIND_WARNINGS:
            yield Verdict(Status.WARN, node.node,
                          f"{who} over {name}, {KIND_WARNINGS[kind]}",
                          _pin(ctx, node, iface, "if this link is the one to use"), details)
        else:
            yield Verdict(Status.PASS, node.node,
                          f"{who} via {name} ({kind}{speed}); pin it with {pin_interface(ctx.options.backend, name)}", None,
                          details)


def _route_json(route: Route | Missing) -> dict:
    """The route as the node reported it, for details ({} when there is none)."""
    return {} if isinstance(route, Missing) else route.to_json()
