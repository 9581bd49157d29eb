"""hangwatch's detection latency for each kind of hang on real programs (issue 12), over N runs
each (default 10), as a ratio to its limit, and whether the right rank was named every time
(alone, or among the ranks named when the evidence left no single one, or wrong).

    python bench/hangwatch_kinds.py [--runs N] [--kinds leave,work,...]

One 2-node lab, one `hangwatch attach master worker1 --json --endless-after 20` for the whole
bench, and torchrun jobs of examples/hang_train.py (2 nodes x 2 ranks) in turn. Latency is the
diagnosis event's time minus the time the guilty rank printed its fault, both this machine's
clock (the lab nodes share it). The limits: a stall named within threshold + 2 s; an exit within
hangwatch's 2 s settle + 2 s; an endless loop within the bound + threshold + 2 s."""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hangwatch.reducer import EXIT_SETTLE  # noqa: E402
from hangwatch.stall import DEFAULT_THRESHOLD  # noqa: E402
from lab import Lab  # noqa: E402
from tests.lab.hangjob import Watch, hangwatch, start_job, wait_until  # noqa: E402

ENDLESS_AFTER = 20.0


@dataclass(frozen=True)
class Kind:
    name: str
    args: tuple[str, ...]      # the job's fault options (the rank and step come per run)
    expect: str                # the diagnosis kind
    limit: float               # seconds after the fault


KINDS = {
    "leave": Kind("leave", ("--fault", "leave"), "deadlock", DEFAULT_THRESHOLD + 2),
    "work": Kind("work", ("--fault", "leave", "--wait", "work"), "deadlock", DEFAULT_THRESHOLD + 2),
    "future": Kind("future", ("--fault", "leave", "--wait", "future"), "deadlock", DEFAULT_THRESHOLD + 2),
    "mismatch": Kind("mismatch", ("--fault", "mismatch"), "mismatch", DEFAULT_THRESHOLD + 2),
    "child": Kind("child", ("--fault", "child"), "deadlock", DEFAULT_THRESHOLD + 2),
    "exit": Kind("exit", ("--fault", "exit"), "exited", EXIT_SETTLE + 2),
    "quit": Kind("quit", ("--fault", "quit"), "exited", EXIT_SETTLE + 2),
    "endless": Kind("endless", ("--fault", "endless"), "endless", ENDLESS_AFTER + DEFAULT_THRESHOLD + 2),
    # The rank prints its fault instead of init_process_group; the others wait there (torch is
    # imported before: the fault and their wait begin within the same second).
    "skip-init": Kind("skip-init", ("--fault", "skip-init"), "rendezvous-stall", DEFAULT_THRESHOLD + 2),
}
RANKS = [(3, 5), (1, 9), (0, 6), (2, 12), (1, 4), (2, 8), (3, 15), (0, 10), (3, 7), (1, 11)]


def one_run(lab: Lab, watch: Watch, kind: Kind, port: int, rank: int, step: int) -> dict:
    mark = len(watch.events)
    job = start_job(lab, "--steps", "500", *kind.args, "--rank", str(rank), "--at", str(step), port=port)
    out = {"latency": None, "right": False, "among": False, "why": ""}
    try:
        try:
            began = job.fault_time(120)
        except AssertionError:
            out["why"] = "the job never reached its fault"
            return out
        try:
            event = wait_until(lambda: next((e for e in watch.events[mark:] if e["event"] == "diagnosis"
                                             and e["time"] >= began), None), kind.limit + 30, "no diagnosis")
        except TimeoutError:
            gone = [e.get("text", "") for e in watch.events[mark:] if e["event"] == "rank-gone"]
            out["why"] = f"nothing named within {kind.limit + 30:.0f} s (exits: {'; '.join(gone)})"
            return out
        diagnosis = event["snapshot"]["diagnosis"]
        out["latency"] = event["time"] - began
        wrong = [f"kind {diagnosis['kind']}"] if diagnosis["kind"] != kind.expect else []
        # Several ranks named, the true one among them: the evidence left no single rank, and the
        # answer said so (hangwatch's "one of these"); counted apart from right and from wrong.
        among = not wrong and len(diagnosis["guilty"]) > 1 and rank in diagnosis["guilty"]
        if diagnosis["guilty"] != [rank]:
            wrong.append(f"guilty {diagnosis['guilty']}")
        # The lab's nodes share one clock: a summary that says they are apart is wrong.
        if "clocks are" in diagnosis["summary"]:
            wrong.append("said the clocks are apart")
            among = False
        out["right"], out["among"] = not wrong, among
        out["why"] = ", ".join(wrong) + (f" ({diagnosis['summary']})" if wrong else "")
        return out
    finally:
        job.stop()
        time.sleep(EXIT_SETTLE + 1)       # the stop's own exits land in this run's window
        for pid in _children(lab):         # the "child" fault's children outlive their rank
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _children(lab: Lab) -> list[int]:
    out = []
    for node in ("master", "worker1"):
        for pid in lab.processes(node):
            try:
                line = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"sleep(7200)" in line or b"sleep\x003600" in line:
                out.append(pid)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--kinds", default=",".join(KINDS))
    args = parser.parse_args()
    kinds = [KINDS[k] for k in args.kinds.split(",")]
    name = "bhk" + secrets.token_hex(2)
    lab, _ = Lab.up(name, nodes=2)
    table = []
    port = 29800
    try:
        with tempfile.TemporaryDirectory() as incidents:
            watch = hangwatch(lab, "--incident-dir", incidents, "--endless-after", str(ENDLESS_AFTER))
            try:
                wait_until(lambda: {e.get("node") for e in watch.events if e["event"] == "node"
                                    and e.get("status") == "watching"} >= {"master", "worker1"},
                           60, "the agents did not start")
                for kind in kinds:
                    runs = []
                    for rank, step in RANKS[:args.runs]:
                        port += 1
                        r = one_run(lab, watch, kind, port, rank, step)
                        runs.append(r)
                        shown = f"{r['latency']:.2f} s" if r["latency"] is not None else "-"
                        print(f"{kind.name:8} rank {rank} at step {step:2}: named after {shown} "
                              f"{'OK' if r['right'] else ('AMONG: ' if r['among'] else 'WRONG: ') + r['why']}", flush=True)
                    table.append((kind, runs))
            finally:
                watch.stop()
    finally:
        Lab.down(name)
    print()
    ok = True
    for kind, runs in table:
        latencies = [r["latency"] for r in runs if r["latency"] is not None]
        right = sum(r["right"] for r in runs)
        among = sum(r["among"] for r in runs)
        within = sum(1 for r in runs if r["latency"] is not None and r["latency"] <= kind.limit)
        ok &= right + among == within == len(runs)
        if latencies:
            print(f"{kind.name:8}: median {statistics.median(latencies):5.1f} s, max {max(latencies):5.1f} s = "
                  f"{max(latencies) / kind.limit:.2f}x of its limit ({kind.limit:.0f} s); right rank alone "
                  f"{right}/{len(runs)}, among the ranks named {among}/{len(runs)}, wrong "
                  f"{len(runs) - right - among}/{len(runs)}, within the limit {within}/{len(runs)}")
        else:
            print(f"{kind.name:8}: nothing named in {len(runs)} runs")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
