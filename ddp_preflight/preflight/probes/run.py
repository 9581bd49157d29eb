"""Run the probes the selected checks need, each isolated: a failure is its data's error."""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable

from ..model import NodeFacts, Options
from . import bandwidth, collectives, compute, network, path_mtu
from .together import MEMBERS, Together

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
               seconds: dict[str, float] | None = None, in_ranks=None) -> dict:
    """`seconds`, when given, gets each probe's wall time (preflight's own time per stage, -v);
    `in_ranks`, under --launch, runs the shared job's parts in the training's ranks (together.py).
    The probes that need torch, when more than one is asked for, run together: one torch job on
    every node at once (together.py), after the ones they read; the network and path-MTU probes
    run at the same time as each other."""
    out: dict = {}
    seconds = {} if seconds is None else seconds
    shared = [n for n in names if n in MEMBERS]
    if len(shared) < 2:
        shared = []
    # The network paths' probes read nothing of the others and measure no CPU: at once. Then the
    # probes that read them, then the ones that need torch, together.
    first = [n for n in names if n not in shared and n not in READS and n not in MEMBERS]
    _at_once(first, cluster, nodes, options, out, seconds)
    for name in sorted((n for n in names if n not in shared and n not in first), key=lambda n: n in READS):
        _one(name, cluster, nodes, options, out, seconds)
    if shared:
        _at_once(shared, cluster, nodes, options, out, seconds, Together(cluster, nodes, options, shared, in_ranks))
    return {name: out[name] for name in names if name in out}


def _at_once(names: list[str], cluster, nodes, options, out: dict, seconds: dict,
             together: Together | None = None) -> None:
    threads = [threading.Thread(target=_one, args=(name, cluster, nodes, options, out, seconds, together),
                                name=f"probe-{name}", daemon=True) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _one(name: str, cluster, nodes, options, out: dict, seconds: dict, together: Together | None = None) -> None:
    started = time.monotonic()
    try:
        seen = {keyword: out.get(probe) for keyword, probe in READS.get(name, {}).items()}
        if together is not None:
            seen["together"] = together
        out[name] = PROBES[name](cluster, nodes, options, **seen)
    except Exception as exc:   # a broken probe must not lose the report
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        out[name] = {"error": f"{type(exc).__name__}: {exc} (at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})"}
    finally:
        if together is not None:
            together.done(name)       # it skipped, or it has what it asked for
    seconds[name] = time.monotonic() - started
