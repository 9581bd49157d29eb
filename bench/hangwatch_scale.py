"""The watcher at scale: recorded agent messages replayed for 1,024 ranks on 128 simulated nodes
through the real reducer and diagnosis (the Watcher shell, no threads, a driven clock), against
the same for 8 ranks on 1 node. Printed: the watcher's CPU per second of watched time (a
fraction of one core; goal: under one core at 1,024 ranks) and the time to name a deadlock, and
their ratios per rank (goal: linear or better).

The messages are what real agents sent during a lab run (tests/unit/artifacts/agent/leave.jsonl:
2 nodes x 2 ranks, rank 3 leaves the loop at 14.6 s): every simulated rank follows the recorded
rank 2 (it trains, then waits in all_reduce), and one follows rank 3 (it leaves); the stacks the
watcher asks for are answered with the recorded ones."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hangwatch.watch import Watcher, WatchTarget  # noqa: E402
from transport import LocalNode  # noqa: E402

RECORDING = ROOT / "tests" / "unit" / "artifacts" / "agent" / "leave.jsonl"
SECONDS = 60.0            # watched time per run
GUILTY = 3                # the recorded rank that leaves


def recording():
    lines = RECORDING.read_text().splitlines()
    header, records = json.loads(lines[0]), [json.loads(line) for line in lines[1:]]
    rank_of = {r["msg"]["pid"]: r["msg"]["rank"] for r in records if r["msg"]["type"] == "rank"}
    cpu: dict[int, list[tuple[float, float]]] = {}      # recorded rank -> [(at, cpu %)]
    stacks: dict[int, list] = {}
    for r in records:
        msg = r["msg"]
        if msg["type"] == "sample":
            for s in msg["ranks"]:
                if "cpu" in s:
                    cpu.setdefault(rank_of[s["pid"]], []).append((r["at"], s["cpu"]))
        elif msg["type"] == "stacks":
            for pid, dump in msg["stacks"].items():
                if isinstance(dump, list):
                    stacks[rank_of[int(pid)]] = dump      # the last ones taken: in the stall
    return header, cpu, stacks


def cpu_at(series: list[tuple[float, float]], at: float) -> float:
    value = series[0][1]
    for when, c in series:
        if when > at:
            break
        value = c
    return value


class Simulated:
    """N nodes x 8 ranks fed to a real Watcher; the agents' side played from the recording."""

    def __init__(self, nodes: int, tmp: str):
        self.header, self.cpu, self.stacks = recording()
        self.names = [f"n{i:03d}" for i in range(nodes)]
        self.now = [0.0]
        self.events: list = []
        self.watcher = Watcher([WatchTarget(LocalNode(n, "python")) for n in self.names], clock=lambda: self.now[0],
                               wall=lambda: 1.8e9 + self.now[0], on_event=self.events.append, incident_dir=tmp)
        self.watcher.links = {n: self for n in self.names}   # the watcher's commands come back here
        self.asked = False
        self.pids = {n: [100000 + i * 16 + local for local in range(8)] for i, n in enumerate(self.names)}
        self.guilty_pid = self.pids[self.names[-1]][7]       # the last rank of all leaves

    def send(self, command: dict) -> bool:
        """Every node's agent answers a stacks request within the next quarter second."""
        if command.get("cmd") == "stacks":
            self.asked = True
        return True

    def pattern(self, pid: int) -> int:
        return GUILTY if pid == self.guilty_pid else 2

    def run(self) -> tuple[float, float | None]:
        """(CPU seconds the watcher used, watched seconds from the fault to the diagnosis)."""
        for n in self.names:
            self.watcher.receive(n, {"type": "hello", "pid": 1, "py_spy": "/usr/bin/py-spy"})
            for local, pid in enumerate(self.pids[n]):
                rank = self.names.index(n) * 8 + local
                self.watcher.receive(n, {"type": "rank", "pid": pid, "rank": rank, "local_rank": local,
                                         "world_size": len(self.names) * 8, "env": {}})
        named = None
        started = time.process_time()
        while self.now[0] < SECONDS:
            self.now[0] = round(self.now[0] + 0.25, 2)
            if self.now[0] % 1 == 0:
                for n in self.names:
                    ranks = [{"pid": pid, "cpu": cpu_at(self.cpu[self.pattern(pid)], self.now[0]),
                              "state": "S", "wchan": "futex_do_wait"} for pid in self.pids[n]]
                    self.watcher.receive(n, {"type": "sample", "t": 1.8e9 + self.now[0], "ranks": ranks,
                                             "gone": [], "net": 0.0})
            if self.asked:
                self.asked = False
                for n in self.names:
                    self.watcher.receive(n, {"type": "stacks", "id": 1, "t": 1.8e9 + self.now[0],
                                             "stacks": {str(pid): self.stacks[self.pattern(pid)] for pid in self.pids[n]}})
            self.watcher.tick()
            if named is None and any(e.kind == "diagnosis" for e in self.events):
                named = self.now[0] - self.header["fault_at"]
        return time.process_time() - started, named


def measure(nodes: int) -> tuple[float, float | None, list]:
    with tempfile.TemporaryDirectory() as tmp:
        sim = Simulated(nodes, tmp)
        used, named = sim.run()
        said = [e for e in sim.events if e.kind == "diagnosis"]
        return used / SECONDS, named, said


def main() -> int:
    small_cpu, small_named, small_said = measure(1)
    big_cpu, big_named, big_said = measure(128)
    ranks_small, ranks_big = 8, 1024
    for ranks, cpu, named, said in ((ranks_small, small_cpu, small_named, small_said),
                                    (ranks_big, big_cpu, big_named, big_said)):
        who = said[0].snapshot.diagnosis if said else None
        print(f"{ranks:5} ranks: the watcher used {cpu * 100:6.2f}% of a core per second watched; "
              f"deadlock named {named:.2f} s after the fault"
              + (f" ({who.kind.value}, culprits {who.culprits})" if who else " (nothing named)"))
    per_rank = (big_cpu / ranks_big) / (small_cpu / ranks_small)
    print(f"CPU per rank at 1,024 ranks = {per_rank:.2f}x the CPU per rank at 8 (goal: <= 1, linear or better); "
          f"{big_cpu:.2f} of a core at 1,024 ranks (goal: < 1); time to name: "
          f"{(big_named or 0) / (small_named or 1):.2f}x of 8 ranks'")
    right = bool(big_said) and big_said[0].snapshot.diagnosis.culprits == [1023]
    return 0 if right and big_cpu < 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
