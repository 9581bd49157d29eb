"""clock-skew: node clocks agree, so logs, timeouts and incident timelines line up."""

from __future__ import annotations

from collections.abc import Iterator

from ..model import Context, Result, Status


def check_clock_skew(ctx: Context) -> Iterator[Result]:
    ID = "clock-skew"
    master = (ctx.master.facts.get("clock") or {}) if ctx.master.error is None else {}
    base = master.get("offset", 0.0)
    # Without the master's clock, nodes are compared with this machine's.
    reference = "the master's" if "offset" in master else "this machine's (the master was not reached)"
    tolerance = ctx.options.clock_tolerance
    for node in ctx.reachable:
        clock = node.facts.get("clock") or {}
        if "offset" not in clock:
            yield Result(ID, Status.ERROR, node.node, f"{node.node}: clock not measured ({clock.get('error', 'no sample')})")
            continue
        skew = clock["offset"] - base
        # Only what the round trip cannot explain counts.
        certain = max(0.0, abs(skew) - clock.get("uncertainty", 0.0) - master.get("uncertainty", 0.0))
        details = {"skew_seconds": round(skew, 4), "uncertainty_seconds": round(clock.get("uncertainty", 0.0), 4)}
        if certain > tolerance:
            side = "ahead of" if skew > 0 else "behind"
            yield Result(ID, Status.WARN, node.node,
                         f"{node.node}'s clock is {abs(skew):.1f} s {side} {reference}",
                         f"sudo timedatectl set-ntp true   # on {node.node} (and the master)", details)
        else:
            yield Result(ID, Status.PASS, node.node,
                         "is the master" if node is ctx.master else f"within {abs(skew) * 1000:.0f} ms of the master",
                         None, details)
