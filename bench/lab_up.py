"""Time `lab up` for 2 and for 16 nodes (until every sshd answers), in one run.

Prints the median of a few builds of each and their ratio. Goal: 16 nodes at most ~8x 2 nodes."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddp_preflight.lab import Lab  # noqa: E402

ROUNDS = 3


def build_seconds(nodes: int) -> float:
    name = f"bench{nodes}"
    started = time.perf_counter()
    Lab.up(name, nodes=nodes)
    took = time.perf_counter() - started
    Lab.down(name)
    return took


def main() -> int:
    two, sixteen = [], []
    for _ in range(ROUNDS):          # interleaved, so drift on the machine hits both alike
        two.append(build_seconds(2))
        sixteen.append(build_seconds(16))
    t2, t16 = statistics.median(two), statistics.median(sixteen)
    ratio = t16 / t2
    print(f"lab up: 2 nodes {t2:.2f} s, 16 nodes {t16:.2f} s (median of {ROUNDS}); "
          f"ratio 16/2 = {ratio:.1f}x (goal <= 8x) {'OK' if ratio <= 8 else 'OVER GOAL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
