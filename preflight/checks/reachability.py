"""node-reachable: every node answers over SSH and runs the training Python."""

from __future__ import annotations

from collections.abc import Iterator

from ..model import Context, Result, Status

ID = "node-reachable"


def check_node_reachable(ctx: Context) -> Iterator[Result]:
    for node in ctx.nodes:
        if node.error:
            yield Result(ID, Status.ERROR, node.node, node.error, node.fix)
            continue
        python = node.section("python") or {}
        os_ = node.section("os") or {}
        yield Result(ID, Status.PASS, node.node,
                     f"reached at {node.facts.get('reached_at', '?')} as {os_.get('hostname', '?')}; "
                     f"Python {python.get('version', '?')} at {python.get('executable', '?')}",
                     details={"hostname": os_.get("hostname"), "python": python.get("executable")})
