"""clock-skew: node clocks agree, so logs, timeouts and incident timelines line up."""

from __future__ import annotations

from collections.abc import Iterator

from ddp_preflight.rules.facts import Missing
from ddp_preflight.rules.fix import run

from ..model import Context, NodeFacts, Status, Verdict


def check_clock_skew(ctx: Context) -> Iterator[Verdict]:
    master = ctx.master.parsed.clock if ctx.master.error is None else Missing("the master was not reached")
    # Without the master's clock, nodes are compared with this machine's.
    base, base_uncertainty = (0.0, 0.0) if isinstance(master, Missing) else (master.offset, master.uncertainty)
    reference = "this machine's (the master was not reached)" if isinstance(master, Missing) else "the master's"
    tolerance = ctx.options.clock_tolerance
    master_boot = _boot_id(ctx.master) if ctx.master.error is None else None
    for node in ctx.reachable:
        if node is not ctx.master and master_boot is not None and _boot_id(node) == master_boot:
            # One kernel (containers or namespaces of one machine): one clock, read by both; a
            # difference measured there is the round trip's, never a skew.
            yield Verdict(Status.PASS, node.node, "shares the master's clock: one kernel (the same boot_id), so no "
                          "skew is possible and none was judged", None, {"same_kernel": True})
            continue
        clock = node.parsed.clock
        if isinstance(clock, Missing):
            yield Verdict(Status.ERROR, node.node,
                          f"{node.node}: clock not measured ({clock.reason if clock.failed else 'no sample'})")
            continue
        skew = clock.offset - base
        # Only what the round trip cannot explain counts.
        certain = max(0.0, abs(skew) - clock.uncertainty - base_uncertainty)
        details = {"skew_seconds": round(skew, 4), "uncertainty_seconds": round(clock.uncertainty, 4)}
        if certain > tolerance:
            side = "ahead of" if skew > 0 else "behind"
            yield Verdict(Status.WARN, node.node,
                          f"{node.node}'s clock is {abs(skew):.1f} s {side} {reference}",
                          run("sudo timedatectl set-ntp true", node.node, f"on {node.node} (and the master)"), details)
        else:
            yield Verdict(Status.PASS, node.node,
                          "is the master" if node is ctx.master else f"within {abs(skew) * 1000:.0f} ms of the master",
                          None, details)


def _boot_id(node: NodeFacts) -> str | None:
    """The node's running kernel's boot (None: not said)."""
    facts = node.parsed.os
    return None if isinstance(facts, Missing) else facts.boot_id
