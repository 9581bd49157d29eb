"""Run the probes the selected checks need, each isolated: a failure is its data's error."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable

from ..model import NodeFacts, Options
from . import bandwidth, collectives, compute, network, path_mtu

PROBES: dict[str, Callable[..., dict]] = {
    "network": network.probe,
    "collectives": collectives.probe,
    "bandwidth": bandwidth.probe,
    "compute": compute.probe,
    "path-mtu": path_mtu.probe,
}
# A probe that reads another's data runs after it and gets it (by keyword): the bandwidth job
# moves large messages between every pair, and a pair whose path drops them (path-mtu) or whose
# connections a firewall blocks (network) would hang it until its bound; the collectives job's
# ranks could not connect over a blocked path either.
READS = {"bandwidth": {"seen": "path-mtu", "network": "network"}, "collectives": {"network": "network"}}


def run_probes(names: list[str], cluster, nodes: tuple[NodeFacts, ...], options: Options,
               seconds: dict[str, float] | None = None) -> dict:
    """`seconds`, when given, gets each probe's wall time (preflight's own time per stage, -v)."""
    out: dict = {}
    for name in sorted(names, key=lambda n: n in READS):
        started = time.monotonic()
        try:
            seen = {keyword: out.get(probe) for keyword, probe in READS.get(name, {}).items()}
            out[name] = PROBES[name](cluster, nodes, options, **seen)
        except Exception as exc:   # a broken probe must not lose the report
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            out[name] = {"error": f"{type(exc).__name__}: {exc} (at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})"}
        if seconds is not None:
            seconds[name] = time.monotonic() - started
    return out
