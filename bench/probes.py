"""The probe stage's wall time on 2 and on 8 lab nodes, every pair of nodes probed, as a ratio
to the 20 s goal on 2 nodes (torchrun jobs included); and the bus bandwidth measured on 2 nodes
as a ratio to a link shaped to 100 Mbit/s (goal: within 15%).

The probe stage is what the probe checks cost on top of the facts: the network probe, the
collectives and bandwidth torchrun jobs, and the compute benchmark on each node in turn. The
network probe is also timed alone, with --nproc-per-node 2, so every path the ranks will use is
tried: every node to every other node's ephemeral ports, both directions, every node to its own
Gloo address, and every worker to the master port. Each run is timed from the CLI's start to
its report, so the facts (about half a second here) are in it too. All lab nodes share this
box's cores; on real machines the torch imports of the nodes run on their own cores, so the
8-node stage here is mostly 8 nodes' torch imports on one box.

A blocked cluster (firewall@worker1: new connections to worker1's ephemeral ports dropped) is
timed against the same lab clean, with every probe check: goal, within 1.5x (issue 26: the
bandwidth job waited out its bound over a path ephemeral-ports had already found blocked).

    python bench/probes.py [--rounds N] [--name PREFIX] [--blocked-only]
    (labs PREFIXb, PREFIX2 and PREFIX8, as root)"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddp_preflight.lab import Lab  # noqa: E402

RATE_MBIT = 100
GOAL_S = 20.0           # the whole probe stage on 2 nodes
PROBE_CHECKS = "master-reachable,ephemeral-ports,collectives,bandwidth,compute-balance"
NETWORK_CHECKS = "master-reachable,ephemeral-ports"


def timed(lab: Lab, only: str, *extra: str) -> tuple[float, dict]:
    hosts = [n.name for n in lab.nodes]
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "ddp_preflight", *hosts, "--json", "--ssh-config",
                           str(lab.ssh_config), "--only", only, *extra],
                          capture_output=True, text=True, timeout=600)
    took = time.perf_counter() - started
    if not done.stdout.strip():
        raise SystemExit(f"preflight gave no report:\n{done.stderr[-2000:]}")
    return took, json.loads(done.stdout)


def paths_tried(report: dict, nodes: list[str]) -> str:
    """How many of the paths between nodes (and from each node to itself) the probe dialled."""
    tried = {(p["src"], p["dst"]) for r in report["results"] if r["check"] == "ephemeral-ports"
             for p in r["details"].get("pairs", []) if p.get("kind") == "listener"}
    between = {(a, b) for a in nodes for b in nodes if a != b}
    own = {(a, a) for a in nodes}
    return (f"{len(tried & between)}/{len(between)} node-to-node, "
            f"{len(tried & own)}/{len(own)} node-to-itself")


def statuses(reports: list[dict]) -> str:
    seen: dict[str, set] = {}
    for report in reports:
        for r in report["results"]:
            seen.setdefault(f"{r['check']}@{r['node'] or '-'}", set()).add(r["status"])
    return ", ".join(f"{k} {'/'.join(sorted(v))}" for k, v in sorted(seen.items()))


def median_line(label: str, times: list[float]) -> str:
    return f"{label}: {statistics.median(times):.1f} s (median of {len(times)}: {', '.join(f'{x:.1f}' for x in times)})"


def two_nodes(name: str, rounds: int) -> tuple[float, list[float]]:
    lab, _ = Lab.up(name, nodes=2, faults=[f"wifi@worker1:{RATE_MBIT}mbit"])
    try:
        stage, network, rates, reports = [], [], [], []
        for _ in range(rounds):
            took, report = timed(lab, PROBE_CHECKS)
            stage.append(took)
            reports.append(report)
            rates += [r["details"]["busbw_bytes_per_s"] * 8 / 1e6 for r in report["results"]
                      if r["check"] == "bandwidth" and "busbw_bytes_per_s" in r["details"]]
            took, report = timed(lab, NETWORK_CHECKS, "--nproc-per-node", "2")
            network.append(took)
        nodes = [n.name for n in lab.nodes]
    finally:
        Lab.down(name)
    t = statistics.median(stage)
    print(f"{median_line('probe stage on 2 nodes', stage)}: ratio to the 20 s goal {t:.1f}/{GOAL_S:.0f} = "
          f"{t / GOAL_S:.2f}x {'OK' if t < GOAL_S else 'OVER GOAL'}")
    print(f"  {median_line('network probe alone, 2 ranks per node', network)}; paths: {paths_tried(report, nodes)}")
    print(f"  results: {statuses(reports)}")
    return t, rates


def eight_nodes(name: str, rounds: int, two: float) -> None:
    lab, _ = Lab.up(name, nodes=8)
    try:
        network, report = [], {}
        for _ in range(rounds):
            took, report = timed(lab, NETWORK_CHECKS, "--nproc-per-node", "2")
            network.append(took)
        nodes = [n.name for n in lab.nodes]
        # Once: eight nodes' torch jobs on this box's cores take minutes a round.
        stage, full = timed(lab, PROBE_CHECKS)
    finally:
        Lab.down(name)
    print(f"probe stage on 8 nodes: {stage:.1f} s (1 run): {stage / two:.1f}x the 2-node stage, "
          f"{stage / GOAL_S:.2f}x the 2-node goal")
    print(f"  {median_line('network probe alone, 2 ranks per node', network)}; paths: {paths_tried(report, nodes)}")
    print(f"  results: {statuses([full, report])}")


BLOCKED_GOAL = 1.5


def blocked_against_clean(name: str, rounds: int) -> float:
    lab, _ = Lab.up(name, nodes=2)
    try:
        clean, blocked = [], []
        for _ in range(rounds):
            clean.append(timed(lab, PROBE_CHECKS)[0])
            lab.add_fault("firewall@worker1")
            took, report = timed(lab, PROBE_CHECKS)
            blocked.append(took)
            lab.clear_faults()
    finally:
        Lab.down(name)
    ratio = statistics.median(blocked) / statistics.median(clean)
    print(f"{median_line('blocked cluster (firewall@worker1)', blocked)}; {median_line('clean', clean)}: "
          f"ratio {ratio:.2f}x (goal within {BLOCKED_GOAL}x) {'OK' if ratio <= BLOCKED_GOAL else 'OVER GOAL'}")
    print(f"  results (blocked): {statuses([report])}")
    return ratio


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--name", default="benchpr", help="lab name prefix (labs PREFIXb, PREFIX2 and PREFIX8)")
    parser.add_argument("--blocked-only", action="store_true", help="only the blocked cluster against the clean one")
    args = parser.parse_args()
    ratio = blocked_against_clean(f"{args.name}b", args.rounds)
    if args.blocked_only:
        return 0 if ratio <= BLOCKED_GOAL else 1
    two, rates = two_nodes(f"{args.name}2", args.rounds)
    eight_nodes(f"{args.name}8", args.rounds, two)
    if not rates:
        print("bus bandwidth: not measured on 2 nodes")
        return 1
    busbw = statistics.median(rates)
    ratio = busbw / RATE_MBIT
    print(f"bus bandwidth {busbw:.1f} Mbit/s on a link shaped to {RATE_MBIT} Mbit/s: ratio {busbw:.1f}/{RATE_MBIT} = "
          f"{ratio:.2f}x (goal within 15%) {'OK' if abs(ratio - 1) <= 0.15 else 'OVER GOAL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
