"""node-reachable: every node answers over SSH and runs the training Python."""

from __future__ import annotations

from collections.abc import Iterator

from rules.facts import Missing
from rules.fix import said

from ..model import Context, Status, Verdict


def check_node_reachable(ctx: Context) -> Iterator[Verdict]:
    for node in ctx.nodes:
        if node.error:
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
