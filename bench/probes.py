"""The whole probe stage on 2 lab nodes, one link shaped to 100 Mbit/s (goal: under 20 s,
torchrun jobs included), and the bus bandwidth measured there as a ratio to the shaped rate
(goal: within 15%).

The probe stage is what the probe checks cost on top of the facts: the network probe, the
collectives and bandwidth torchrun jobs, and the compute benchmark on each node in turn. The
run is timed from the CLI's start to its report, so the facts (about half a second here) are in
it too. Both lab nodes share this box's cores; on real machines the torch imports of the two
nodes run on their own cores."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab import Lab  # noqa: E402

NAME = "benchpr"
RATE_MBIT = 100
ROUNDS = 3
PROBE_CHECKS = "master-reachable,ephemeral-ports,collectives,bandwidth,compute-balance"


def timed(lab: Lab) -> tuple[float, dict]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "preflight", "master", "worker1", "--json", "--ssh-config",
                           str(lab.ssh_config), "--only", PROBE_CHECKS],
                          capture_output=True, text=True, timeout=180)
    took = time.perf_counter() - started
    if not done.stdout.strip():
        raise SystemExit(f"preflight gave no report:\n{done.stderr[-2000:]}")
    return took, json.loads(done.stdout)


def main() -> int:
    lab, _ = Lab.up(NAME, nodes=2, faults=[f"wifi@worker1:{RATE_MBIT}mbit"])
    try:
        times, rates, statuses = [], [], {}
        for _ in range(ROUNDS):
            took, report = timed(lab)
            times.append(took)
            for r in report["results"]:
                statuses.setdefault(f"{r['check']}@{r['node'] or '-'}", set()).add(r["status"])
                if r["check"] == "bandwidth" and "busbw_bytes_per_s" in r["details"]:
                    rates.append(r["details"]["busbw_bytes_per_s"] * 8 / 1e6)
    finally:
        Lab.down(NAME)
    t = statistics.median(times)
    print(f"probe stage on 2 nodes: {t:.1f} s (median of {ROUNDS}: {', '.join(f'{x:.1f}' for x in times)}) "
          f"(goal < 20 s) {'OK' if t < 20 else 'OVER GOAL'}")
    if not rates:
        print(f"bus bandwidth: not measured; results: {statuses}")
        return 1
    busbw = statistics.median(rates)
    ratio = busbw / RATE_MBIT
    print(f"bus bandwidth {busbw:.1f} Mbit/s on a link shaped to {RATE_MBIT} Mbit/s: ratio {busbw:.1f}/{RATE_MBIT} = "
          f"{ratio:.2f}x (goal within 15%) {'OK' if abs(ratio - 1) <= 0.15 else 'OVER GOAL'}")
    print("  results: " + ", ".join(f"{k} {'/'.join(sorted(v))}" for k, v in statuses.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
