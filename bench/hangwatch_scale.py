"""The watcher at scale: recorded agent messages replayed for 8 ranks on 1 simulated node, 1,024 on
128, 4,096 on 512 and 16,384 on 2,048, through the real reducer and diagnosis (the Watcher shell, no
threads, a driven clock). Printed: the watcher's CPU per second of watched time (a fraction of one
core; goal: under one core at 4,096 ranks), the CPU per rank against 8 ranks' (goal: flat, at most
1.2x at 4,096) and the time to name the hang (goal: the same at every size).

    .venv/bin/python bench/hangwatch_scale.py [--sizes 8,1024,4096,16384] [--seconds 60] [--recording leave]

The messages are what real agents sent during a lab run (tests/unit/artifacts/agent/leave.jsonl:
2 nodes x 2 ranks, rank 3 leaves the loop): every simulated rank follows the recorded rank 2 (it
trains, then waits in all_reduce), and one follows rank 3 (it leaves); the stacks the watcher asks
for are answered with the recorded ones. --recording straggle plays straggle.jsonl the same way (its
rank 0 computes for long while the others wait: a straggler notice that stands, said again at each
judging); any recording of that folder: its faulty rank (its header's), and the lowest other rank
for the rest."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ddp_preflight.hangwatch.watch import Watcher, WatchTarget  # noqa: E402
from ddp_preflight.transport import LocalNode  # noqa: E402

AGENT = ROOT / "tests" / "unit" / "artifacts" / "agent"
RECORDING = AGENT / "leave.jsonl"
SECONDS = 60.0            # watched time per run
VERDICTS = ("diagnosis", "straggler")      # the events that say a verdict on the fault


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


def roles(header: dict, cpu: dict) -> tuple[int, int]:
    """(the recorded rank at fault, the recorded rank every other simulated rank follows)."""
    return header["rank"], min(r for r in cpu if r != header["rank"])


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
        self.guilty, self.others = roles(self.header, self.cpu)
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
        return self.guilty if pid == self.guilty_pid else self.others

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
            if named is None and any(e.kind in VERDICTS for e in self.events):
                named = self.now[0] - self.header["fault_at"]
        return time.process_time() - started, named


def measure(nodes: int) -> tuple[float, float | None, list, int]:
    """(a fraction of one core, seconds from the fault to the verdict, the verdicts said, the ticks
    that judged: hangwatch/due.py)."""
    with tempfile.TemporaryDirectory() as tmp:
        sim = Simulated(nodes, tmp)
        used, named = sim.run()
        said = [e for e in sim.events if e.kind in VERDICTS]
        return used / SECONDS, named, said, sim.watcher.state.judgements


def main() -> int:
    global SECONDS, RECORDING
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="8,1024,4096,16384", help="ranks, multiples of 8")
    parser.add_argument("--seconds", type=float, default=SECONDS, help="watched seconds per size (leave's fault is at 6.1 s)")
    parser.add_argument("--recording", default="leave", help="a recording of tests/unit/artifacts/agent (its name)")
    args = parser.parse_args()
    SECONDS, RECORDING = args.seconds, AGENT / f"{args.recording}.jsonl"
    sizes = [int(s) for s in args.sizes.split(",")]
    measured = {}
    for ranks in sizes:
        cpu, named, said, judged = measure(ranks // 8)
        measured[ranks] = (cpu, named, said)
        who = said[0].snapshot.diagnosis if said else None
        right = who is not None and who.culprits == [ranks - 1]
        print(f"{ranks:6} ranks: the watcher used {cpu * 100:7.2f}% of a core per second watched "
              f"({cpu / ranks * 1e6:6.1f} us per rank per second); "
              + ("hang named " if not said or said[0].kind == "diagnosis" else "verdict said ")
              + (f"{named:.2f} s after the fault" if named is not None else "never")
              + (f" ({who.kind.value}, culprits {who.culprits}{'' if right else ': WRONG'})" if who else " (nothing named)")
              + f"; judged at {judged} of {int(SECONDS * 4)} ticks", flush=True)
    small = min(sizes)
    base_cpu, base_named, _ = measured[small]
    ok = True
    for ranks in sizes:
        if ranks == small:
            continue
        cpu, named, said = measured[ranks]
        per_rank = (cpu / ranks) / (base_cpu / small)
        ok = ok and bool(said) and said[0].snapshot.diagnosis.culprits == [ranks - 1]
        print(f"  {ranks:6} ranks: CPU per rank {per_rank:.2f}x {small} ranks' (goal <= 1.2 up to 4,096); "
              f"{cpu:.2f} of a core (goal < 1 at 4,096); time to name {(named or 0) / (base_named or 1):.2f}x {small} ranks'")
        if ranks == 4096:
            ok = ok and cpu < 1.0 and per_rank <= 1.2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
