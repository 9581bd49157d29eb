"""A strict reverse-path filter as the cause of paths the network probe found blocked between two
nodes, the master and a worker or two workers (issue 26: it was a firewall, with a fix that could
not help). Named on evidence only: every such path silently dropped, on the node the route back to
the other goes out another interface than the one the other's packets arrive on, and that one's
rp_filter is strict (rules/routes.strict_reverse_path). The kernel's count of reverse-path drops
while the probe listened there, when it rose, is said with it."""

from __future__ import annotations

from collections.abc import Iterable

from ddp_preflight.rules.facts import Missing, Route
from ddp_preflight.rules.routes import MASTER, ReversePathDrop, route_to_master, strict_reverse_path

from ..model import Context
from ..probes.network_seen import Dial, NetworkSeen


def reverse_path_drop(ctx: Context, seen: NetworkSeen, name: str, dials: Iterable[Dial],
                      other: str | None = None) -> ReversePathDrop | None:
    """Whether `name`'s strict reverse-path filter explains every one of these dials between it
    and `other` (the master unless named): each dropped without an answer, none between them
    answered (it drops all the other sends there), and what the other sent on each (to `name`'s
    listener, or its answers to the address `name` dialled from) arrives on an interface whose
    filter is strict, not the one `name`'s route to the other goes out."""
    node = next((n for n in ctx.nodes if n.node == name), None)
    other = ctx.master.node if other is None else other
    dials = list(dials)
    if node is None or name == other or not dials or not silent(seen, {name, other}, dials):
        return None
    route, peer = route_toward(ctx, seen, name, other)
    listener = seen.listeners.get(name)
    found = None
    for dial in dials:
        # The other dials the node's listener; the node dials from its route's source address.
        address = (listener.address if listener else None) if dial.dst == name else \
            (route.source if route else None)
        one = strict_reverse_path(node, address, route, peer) if route else None
        if one is None:
            return None
        found = found or one
    return found


def silent(seen: NetworkSeen, pair: set[str], dials: list[Dial]) -> bool:
    """The evidence a cause in one end's routing needs: every one of these dials between the pair
    went nowhere (Dial.went_nowhere), and nothing either sent the other answered."""
    return all(d.went_nowhere and {d.src, d.dst} == pair for d in dials) and not seen.answered(pair)


def unanswered(seen: NetworkSeen, src: str, dst: str) -> bool:
    """The evidence a detour of `src`'s own route to `dst` needs: `src` dialled `dst`, every one
    of those dials silently dropped, and nothing either sent the other answered. How `dst`'s
    dials the other way failed is not asked: where the detour also moved `src`'s own listener
    (its ranks bind the address out the detour), `dst` has no route there ("unreachable"), a
    consequence of the same route, not evidence against it."""
    dials = [d for d in seen.dials if d.src == src and d.dst == dst]
    return bool(dials) and all(d.went_nowhere for d in dials) and not seen.answered({src, dst})


def route_toward(ctx: Context, seen: NetworkSeen, name: str, other: str) -> tuple[Route | None, str]:
    """`name`'s own route to the other end of a path, and that end in words: to the master, the
    route its facts read (route_to_master); to a peer, the one its dials there reported."""
    if other == ctx.master.node and name != other:
        node = next(n for n in ctx.nodes if n.node == name)
        route = route_to_master(node)
        return (None if isinstance(route, Missing) else route), MASTER
    return seen.route(name, other), other


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
