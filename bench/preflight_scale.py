"""Preflight wall time on 2 vs 16 lab nodes, in one run (goal: 16 nodes under 1.5x 2 nodes): the
facts and checks (--no-probes); the probes' torchrun jobs are bench/probes.py's.

All nodes are checked in parallel, so on real machines the 16-node run costs about what the
slowest node costs. Here the 16 "machines" share this box's cores, so the collectors' own CPU
time adds up; the figure printed says how much of the ratio that is."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddp_preflight.lab import Lab  # noqa: E402

ROUNDS = 3
NAME = "benchpf"


def busy_cpu() -> float:
    """CPU-seconds the whole machine has spent busy (every process: ours, sshd, the nodes')."""
    fields = list(map(int, open("/proc/stat").readline().split()[1:]))
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def timed(lab: Lab, hosts: list[str], cpu: list[float] | None = None) -> float:
    before = busy_cpu()
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "ddp_preflight", *hosts, "--json", "--no-probes", "--ssh-config",
                           str(lab.ssh_config), "--data-dir", str(lab.state.data_dir)],
                          capture_output=True, text=True)
    took = time.perf_counter() - started
    if cpu is not None:
        cpu.append(busy_cpu() - before)
    if done.returncode != 0:
        raise SystemExit(f"preflight failed on the clean lab:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return took


def main() -> int:
    lab, _ = Lab.up(NAME, nodes=16)
    try:
        names = [n.name for n in lab.nodes]
        timed(lab, names[:2])                      # warm caches (page cache, shard cache)
        two, sixteen, cpu16 = [], [], []
        for _ in range(ROUNDS):
            two.append(timed(lab, names[:2]))
            sixteen.append(timed(lab, names, cpu16))
    finally:
        Lab.down(NAME)
    t2, t16 = statistics.median(two), statistics.median(sixteen)
    ratio = t16 / t2
    print(f"preflight: 2 nodes {t2:.2f} s, 16 nodes {t16:.2f} s (median of {ROUNDS}); "
          f"ratio 16/2 = {ratio:.2f}x (goal < 1.5x) {'OK' if ratio < 1.5 else 'OVER GOAL'}")
    cores = os.cpu_count() or 1
    c16 = statistics.median(cpu16)
    print(f"  the 16-node run kept this {cores}-core box busy for {c16:.2f} CPU-s "
          f"({c16 / 16:.2f} per node: collector, sshd session, key exchange); "
          f"with every simulated machine sharing these cores its floor is {c16 / cores:.2f} s, "
          f"so the run is {'CPU-bound' if c16 / cores > 0.8 * t16 else 'not CPU-bound'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
