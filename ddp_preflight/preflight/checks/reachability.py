"""node-reachable: every node answers over SSH and runs the training Python. Where nothing answered
this machine's dial, this machine's own route to the node's address is judged by the rule that
judges a node's route to the master (rules/routes.py): a route out a link that carries nothing, or
a second interface's route that takes over the LAN's, is the cause, with the command that removes
it, rather than "a firewall may drop port 22"."""

from __future__ import annotations

from collections.abc import Iterator

from ddp_preflight.rules.facts import Missing, NodeFacts
from ddp_preflight.rules.fix import Fix, said
from ddp_preflight.rules.routes import dead_in, detour_in, drop_route

from ..model import Context, Status, Verdict

DIALLED = "dialled_from_here"    # in an unreachable node's facts (Facts.dialled_from_here)
HERE = "this machine"            # where ddp-preflight runs, and ssh dials from


def check_node_reachable(ctx: Context) -> Iterator[Verdict]:
    for node in ctx.nodes:
        if node.error:
            cause = route_from_here(node)
            if cause is not None:
                why, fix, route = cause
                yield Verdict(Status.ERROR, node.node, f"{node.node}: nothing answers ssh at {route['address']}: {why}",
                              fix, {"route_from_here": route})
                continue
            yield Verdict(Status.ERROR, node.node, node.error, said(node.fix, node.node))
            continue
        facts = node.parsed
        hostname = None if isinstance(facts.os, Missing) else facts.os.hostname
        python = None if isinstance(facts.python, Missing) else facts.python
        executable = python.executable if python else None
        yield Verdict(Status.PASS, node.node,
                      f"reached at {'?' if isinstance(facts.reached_at, Missing) else facts.reached_at} as "
                      f"{hostname or '?'}; Python {python.version if python else '?'} at {executable or '?'}",
                      details={"hostname": hostname, "python": executable})


def route_from_here(node: NodeFacts) -> tuple[str, Fix, dict] | None:
    """Why this machine's dial to the node got nowhere, if its own route there says it: (why, the
    fix on this machine, the route as read). None where the route is not the cause."""
    network = node.parsed.dialled_from_here
    if isinstance(network, Missing) or isinstance(network.route_to_master, Missing):
        return None
    dead = dead_in(network, network.route_to_master)
    if dead is not None:
        judged, why = dead
        return (f"{HERE}'s route to {judged.address} goes out {judged.interface}, which {why}: "
                f"its connections to {node.node} go nowhere", drop_route(HERE, judged, node.node),
                dict(judged.sent))
    taken = detour_in(network, network.route_to_master)
    if taken is not None:
        judged, why, lan = taken
        return (f"{HERE}'s route to {judged.address} goes out {judged.interface}, which {why}: "
                f"its connections to {node.node} go nowhere", drop_route(HERE, judged, node.node, lan),
                dict(judged.sent))
    return None
