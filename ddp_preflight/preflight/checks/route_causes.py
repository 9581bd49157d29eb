"""The cause of a path the network probe found blocked, when it lies in one end's own routing:
between the master and a worker, or between two workers (issue 26). A dead route (out a link that
carries nothing) on either end, or a strict reverse-path filter on either end whose route back to
the other goes out another interface; named on the node that has it, with the one fix there, and
never a firewall. On evidence only: every dial on that path silently dropped, none answered."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddp_preflight.rules.fix import Fix
from ddp_preflight.rules.routes import ReversePathDrop, dead_route, detour, drop_route, loosen_or_drop

from ..model import Context
from ..probes.network_seen import Dial, NetworkSeen
from .reverse_path import counted, reverse_path_drop, route_toward, silent


@dataclass(frozen=True)
class RouteCause:
    node: str                    # the end that has it
    why: str                     # in words, on that node: "worker1's route to ... goes out eth1, which ..."
    fix: Fix
    details: dict[str, Any] = field(default_factory=dict, compare=False)


def route_cause(ctx: Context, seen: NetworkSeen, src: str, dst: str, dials: list[Dial]) -> RouteCause | None:
    """Why these dials from `src` into `dst` got nowhere, if one end's own routing says it: the
    dialling end's route to the other out a dead link (its connections go nowhere), the receiving
    end's (its answers go nowhere), or a strict reverse-path filter on either end."""
    pair = {src, dst}
    if src == dst or not dials or not silent(seen, pair, dials):
        return None
    for end, other in ((src, dst), (dst, src)):
        node = next((n for n in ctx.nodes if n.node == end), None)
        route, peer = route_toward(ctx, seen, end, other) if node is not None else (None, other)
        dead = dead_route(node, route) if node is not None and route is not None else None
        if dead is not None:
            route, why = dead
            role = "its connections to" if end == src else "its answers to"
            return RouteCause(end, f"{end}'s route to {route.address} goes out {route.interface}, which {why}: "
                              f"{role} {peer} go nowhere", drop_route(end, route, peer), {"route": dict(route.sent)})
    for end, other in ((src, dst), (dst, src)):
        rp = reverse_path_drop(ctx, seen, end, dials, other)
        if rp is not None:
            return RouteCause(end, f"{rp.why(end)}{counted(seen, end)}", loosen_or_drop(end, rp),
                              reverse_path_details(rp, seen, end))
    for end, other in ((src, dst), (dst, src)):
        # A live second interface whose route takes over the LAN's: what goes out there never
        # arrives (every dial silent, nothing answered). After the reverse-path filter, whose
        # asymmetric path is also a route out another interface, with its own fix.
        node = next((n for n in ctx.nodes if n.node == end), None)
        route, peer = route_toward(ctx, seen, end, other) if node is not None else (None, other)
        taken = detour(node, route) if node is not None and route is not None else None
        if taken is not None:
            route, why, lan = taken
            role = "its connections to" if end == src else "its answers to"
            return RouteCause(end, f"{end}'s route to {route.address} goes out {route.interface}, which {why}: "
                              f"{role} {peer} go nowhere", drop_route(end, route, peer, lan), {"route": dict(route.sent)})
    return None


def reverse_path_details(rp: ReversePathDrop, seen: NetworkSeen, name: str) -> dict:
    listener = seen.listeners.get(name)
    return {"route": dict(rp.route.sent),
            "reverse_path": {"node": name, "arriving": rp.arriving.name, "address": rp.address,
                             "rp_filter": rp.arriving.rp_filter,
                             "drops_while_probed": listener.rp_filter_drops if listener else None}}
