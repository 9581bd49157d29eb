"""hangwatch's detection latency over 10 deadlocks, as a ratio to the stall threshold (limit: a
deadlock named within threshold + 2 s, with the right rank and line, every time).

One 2-node lab, one `hangwatch attach master worker1 --json` at the default threshold for the
whole bench, and 10 torchrun jobs of examples/hang_train.py (2 nodes x 2 ranks) in turn, each
with one rank leaving the loop at some step (`--fault leave`): the others wait in all_reduce, the
guilty rank sleeps. Latency is the diagnosis event's time minus the time the guilty rank printed
when it left: both are this machine's clock, which the lab nodes share. The guilty rank repeats
in consecutive runs on purpose: the watcher says a diagnosis once per stall, and a new job is a
new stall that must be said again even when it names the same rank."""

from __future__ import annotations

import json
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ddp_preflight.hangwatch.stall import DEFAULT_THRESHOLD  # noqa: E402
from ddp_preflight.lab import Lab  # noqa: E402
from tests.lab.hangjob import SCRIPT, Watch, hangwatch, start_job, wait_until  # noqa: E402

# (guilty rank, step it leaves at) for each run: every rank, twice in a row for some.
RUNS = [(3, 5), (3, 9), (0, 6), (1, 12), (1, 4), (2, 8), (2, 15), (0, 10), (3, 7), (1, 11)]
PORT = 29700
LIMIT = DEFAULT_THRESHOLD + 2


def sleep_line() -> int:
    """Where the guilty rank sleeps: read when each job starts, as the script may be edited meanwhile."""
    return next(i for i, line in enumerate(SCRIPT.read_text().splitlines(), 1) if "time.sleep(3600)" in line)


def one_run(lab: Lab, watch: Watch, index: int, rank: int, step: int) -> dict:
    """Start the job, time the deadlock's diagnosis, stop the job and wait (up to 10 s) for the
    watcher to say every rank gone. Returns what was measured and checked."""
    mark, line = len(watch.events), sleep_line()
    job = start_job(lab, "--steps", "500", "--fault", "leave", "--rank", str(rank), "--at", str(step),
                    port=PORT + index)
    result = {"rank": rank, "step": step, "latency": None, "right": False, "ok": False, "why": "", "between": [],
              "gone_said": False, "gone_missing": []}
    try:
        try:
            left_at = job.fault_time(120)
        except AssertionError:
            result["why"] = f"the job never reached its fault: {job.lines[-5:]}"
            return result
        try:
            event = wait_until(lambda: next((e for e in watch.events[mark:] if e["event"] == "diagnosis"
                                             and e["time"] >= left_at), None),
                               DEFAULT_THRESHOLD + 30, "no diagnosis")
        except TimeoutError:
            result["why"] = f"no diagnosis within {DEFAULT_THRESHOLD + 30:.0f} s of the fault"
            return result
        result["latency"] = latency = event["time"] - left_at
        diagnosis = event["snapshot"]["diagnosis"]
        frame = next((r.get("frame") for r in event["snapshot"]["ranks"] if r["rank"] == rank), None)
        problems = []
        if diagnosis["kind"] != "deadlock":
            problems.append(f"kind {diagnosis['kind']}")
        if diagnosis["culprits"] != [rank]:
            problems.append(f"culprits {diagnosis['culprits']}")
        if frame != f"hang_train.py:{line}":
            problems.append(f"frame {frame}")
        result["right"] = not problems
        if latency > LIMIT:
            problems.append(f"{latency:.1f} s > {LIMIT:.0f} s")
        result["ok"], result["why"] = not problems, ", ".join(problems)
        result["summary"] = diagnosis["summary"]
        # Where the time went: the watcher's estimate of when the stall began, and how long it
        # had been stalled when it named it (the threshold, or more when stacks came late).
        result["parts"] = (diagnosis["since"] - left_at, event["time"] - diagnosis["since"])
        return result
    finally:
        pids = {e["pid"] for e in watch.events[mark:] if e["event"] == "rank-found"}
        stopped = len(watch.events)
        job.stop()
        # Not part of the figure: whether the watcher said every rank gone (the job is gone
        # either way: job.stop() kills what is left of it).
        try:
            wait_until(lambda: pids <= {e["pid"] for e in watch.events[stopped:] if e["event"] == "rank-gone"},
                       10, "ranks not said gone")
            result["gone_said"] = True
        except TimeoutError:
            result["gone_said"] = False
            result["gone_missing"] = sorted(pids - {e["pid"] for e in watch.events[stopped:]
                                                   if e["event"] == "rank-gone"})
        time.sleep(3)     # the watcher judges exits 2 s after them: let that land in this run's window
        result["between"] = [e["text"] for e in watch.events[stopped:] if e["event"] == "diagnosis"]


def main() -> int:
    name = "bhw" + secrets.token_hex(2)
    lab, _ = Lab.up(name, nodes=2)
    results = []
    try:
        with tempfile.TemporaryDirectory() as incidents:
            watch = hangwatch(lab, "--incident-dir", incidents, "--keep-watching")
            try:
                wait_until(lambda: {e.get("node") for e in watch.events if e["event"] == "node"
                                    and e.get("status") == "watching"} >= {"master", "worker1"},
                           60, "the agents did not start")
                for i, (rank, step) in enumerate(RUNS):
                    r = one_run(lab, watch, i, rank, step)
                    results.append(r)
                    latency = f"{r['latency']:.2f} s" if r["latency"] is not None else "-"
                    print(f"run {i + 1:2}: rank {rank} leaves at step {step:2}: named after {latency}"
                          + (f" (stall seen from {r['parts'][0]:+.2f} s, named at {r['parts'][1]:.2f} s stalled) "
                             if r.get("parts") else " ")
                          + f"{'OK' if r['ok'] else 'FAIL: ' + r['why']}"
                          + (f"; after the stop: {'; '.join(r['between'])}" if r["between"] else "")
                          + ("" if r["gone_said"] else f"; no rank-gone event for pid {r['gone_missing']}"),
                          flush=True)
            finally:
                code = watch.stop()
                log = Path(tempfile.gettempdir()) / f"hangwatch-detection-{name}.jsonl"
                log.write_text("".join(json.dumps(e) + "\n" for e in watch.events))
                print(f"hangwatch's events: {log}")
                if code not in (0, 1, 130):
                    print(f"hangwatch exited {code}: {watch.stderr[-2000:]}")
    finally:
        Lab.down(name)
    latencies = [r["latency"] for r in results if r["latency"] is not None]
    right = sum(r["right"] for r in results)
    within = sum(r["ok"] for r in results)
    if not latencies:
        print("detection: no deadlock was named")
        return 1
    worst = max(latencies)
    print(f"detection: median {statistics.median(latencies):.1f} s, max {worst:.1f} s at threshold "
          f"{DEFAULT_THRESHOLD:g} s = max {worst / DEFAULT_THRESHOLD:.2f}x of the threshold (limit: threshold + 2 s = "
          f"{LIMIT / DEFAULT_THRESHOLD:.2f}x); named {len(latencies)}/{len(RUNS)}, right rank and line "
          f"{right}/{len(RUNS)}, within the limit {within}/{len(RUNS)} {'OK' if within == len(RUNS) else 'OVER LIMIT'}")
    said = sum(r["gone_said"] for r in results)
    if said < len(results):
        print(f"  besides: after {len(results) - said} of {len(results)} stops hangwatch sent no rank-gone event for "
              "some rank (see the events' log)")
    return 0 if within == len(RUNS) else 1


if __name__ == "__main__":
    sys.exit(main())
