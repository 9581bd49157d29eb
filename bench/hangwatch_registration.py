"""What finding ranks costs the watcher: N ranks (8 a node) announced by their agents' rank messages,
through the real Watcher (no threads, a driven clock). Printed: the CPU to register them all and per
rank, and the per-rank cost at each size against the smallest's (goal: flat; it grew with the ranks
already found while every new one walked them all).

    .venv/bin/python bench/hangwatch_registration.py [--sizes 1024,4096,16384]"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddp_preflight.hangwatch.watch import Watcher, WatchTarget  # noqa: E402
from ddp_preflight.transport import LocalNode  # noqa: E402


def register(ranks: int, incidents: str) -> float:
    """CPU seconds to register `ranks` ranks of one run."""
    nodes = [f"n{i:04d}" for i in range(max(1, ranks // 8))]
    watcher = Watcher([WatchTarget(LocalNode(n, "python")) for n in nodes], clock=lambda: 0.0, wall=lambda: 1.0,
                      incident_dir=incidents)
    start = time.process_time()
    for i, node in enumerate(nodes):
        for local in range(8):
            watcher.receive(node, {"type": "rank", "pid": 100000 + i * 16 + local, "ppid": 90, "rank": i * 8 + local,
                                   "local_rank": local, "world_size": ranks, "master": "10.0.0.1:29500", "env": {}})
    return time.process_time() - start


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1024,4096,16384")
    sizes = [int(s) for s in parser.parse_args().sizes.split(",")]
    first = None
    with tempfile.TemporaryDirectory() as incidents:
        for n in sizes:
            per_rank = register(n, incidents) / n
            first = first or per_rank
            print(f"{n:6d} ranks: {per_rank * n:6.2f} s of CPU, {per_rank * 1e6:6.1f} us a rank, "
                  f"{per_rank / first:.2f}x the {sizes[0]}'s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
