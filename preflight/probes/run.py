"""Run the probes the selected checks need, each isolated: a failure is its data's error."""

from __future__ import annotations

import traceback

from ..model import NodeFacts, Options
from . import bandwidth, collectives, compute, network

PROBES = {
    "network": network.probe,
    "collectives": collectives.probe,
    "bandwidth": bandwidth.probe,
    "compute": compute.probe,
}


def run_probes(names: list[str], cluster, nodes: tuple[NodeFacts, ...], options: Options) -> dict:
    out = {}
    for name in names:
        try:
            out[name] = PROBES[name](cluster, nodes, options)
        except Exception as exc:   # a broken probe must not lose the report
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            out[name] = {"error": f"{type(exc).__name__}: {exc} (at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})"}
    return out
