"""A strict reverse-path filter as the cause of paths the network probe found blocked between the
master and a worker (issue 26: it was a firewall on the master, with a fix that could not help).
Named on evidence only: every such path silently dropped, on the worker the route back to the
master goes out another interface than the one the master's packets arrive on, and that one's
rp_filter is strict (rules/routes.strict_reverse_path). The kernel's count of reverse-path drops
while the probe listened there, when it rose, is said with it."""

from __future__ import annotations

from collections.abc import Iterable

from rules.facts import Missing
from rules.routes import ReversePathDrop, route_to_master, strict_reverse_path

from ..model import Context
from ..probes.network_seen import Dial, NetworkSeen


def reverse_path_drop(ctx: Context, seen: NetworkSeen, name: str, dials: Iterable[Dial]) -> ReversePathDrop | None:
    """Whether `name`'s strict reverse-path filter explains every one of these dials between it
    (a worker) and the master: each dropped without an answer, none between them answered (it
    drops all the master sends there), and what the master sent on each (to `name`'s listener, or
    its answers to the address `name` dialled from) arrives on an interface whose filter is
    strict, not the one `name`'s route to the master goes out."""
    node = next((n for n in ctx.nodes if n.node == name), None)
    dials = list(dials)
    if node is None or node is ctx.master or not dials:
        return None
    pair = {name, ctx.master.node}
    if any(d.outcome in ("open", "open-unverified", "refused") for d in seen.dials if {d.src, d.dst} == pair):
        return None        # something the master sent got in: a strict filter on this path drops all of it
    route, listener = route_to_master(node), seen.listeners.get(name)
    found = None
    for dial in dials:
        if dial.outcome != "filtered" or {dial.src, dial.dst} != pair:
            return None
        # The master dials the node's listener; the node dials from its route's source address.
        address = (listener.address if listener else None) if dial.dst == name else \
            (None if isinstance(route, Missing) else route.source)
        one = strict_reverse_path(node, address)
        if one is None:
            return None
        found = found or one
    return found


def counted(seen: NetworkSeen, name: str) -> str:
    """The kernel's own word, when it has one: the reverse-path drops it counted on `name` while
    the probe listened there ("" when none were counted; ARP requests it drops are not)."""
    listener = seen.listeners.get(name)
    drops = listener.rp_filter_drops if listener else None
    if not drops:
        return ""
    return f" (the kernel counted {drops} reverse-path drop{'s' if drops != 1 else ''} on {name} while the probe ran)"


def network_seen(ctx: Context) -> NetworkSeen | None:
    """What the network probe saw, where it ran (a check that does not need it reads it when it is there)."""
    data = ctx.probes.get("network")
    if not data or "error" in data or "skipped" in data:
        return None
    return NetworkSeen.from_json(data)
