"""Time to a deadlock's verdict with six processes posing as ranks beside it, as a ratio to the same
run without them, measured in one run (issue 23, attack 9: six impostors pointing at stores that
accept and never answer took a verdict from 5 s to 94 s and were named as culprits).

    python bench/hangwatch_impostors.py [--runs N]

One 2-node lab, as root. Each round runs the same real 2-node x 2-rank torchrun job of
examples/hang_train.py (rank 3 leaves the loop at step 5) under a fresh `hangwatch attach master
worker1 --json`, three ways, one after the other:
- plain:     nothing else on the nodes;
- impostors: six processes of another user (tests/hostile.py's intruder) on master, posing as ranks
             of a world of 4 (tests/impostors.py), each waiting on a silent store of its own: not
             followed once root's own ranks are found;
- followed:  the same six, and the watch asked to follow that user too (`--pid` of one of them):
             each is a run of its own, its store read (all six together, one deadline), unknown.
Latency is the verdict's time minus the time the faulty rank printed its fault (one clock: the lab's
nodes share this machine's). Each verdict must name rank 3 alone, and no impostor."""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ddp_preflight.lab import Lab  # noqa: E402
from tests import impostors  # noqa: E402
from tests.hostile import hostile_user  # noqa: E402
from tests.lab.hangjob import NODES, hangwatch, start_job, wait_until  # noqa: E402

WAYS = ("plain", "impostors", "followed")
LIMIT = 120.0        # seconds after the fault a verdict is waited for


def one(lab: Lab, way: str, port: int, scratch: Path) -> dict:
    crowd = None
    if way != "plain":
        intruder = hostile_user()
        crowd = impostors.start(intruder, 6, host=lab.node("master").ipv4, world=4,
                                wrap=lambda argv: lab.command("master", impostors.as_intruder(intruder) + argv))
    args = ("--pid", str(crowd.pids[0])) if way == "followed" and crowd is not None else ()
    watch = hangwatch(lab, "--incident-dir", str(scratch / f"incidents-{port}"), "--keep-watching", *args)
    job = None
    try:
        wait_until(lambda: {e.get("node") for e in watch.events if e["event"] == "node"
                            and e.get("status") == "watching"} >= set(NODES), 60, "the agents did not start")
        job = start_job(lab, "--steps", "500", "--fault", "leave", "--rank", "3", "--at", "5", port=port)
        began = job.fault_time(120)
        event = wait_until(lambda: next((e for e in watch.events if e["event"] == "diagnosis"), None), LIMIT,
                           f"no verdict within {LIMIT:.0f} s")
        diagnosis = event["snapshot"]["diagnosis"]
        named = {e["pid"] for e in diagnosis["evidence"]} & set(crowd.pids if crowd else ())
        right = diagnosis["kind"] == "deadlock" and diagnosis["culprits"] == [3] and not named
        return {"latency": event["time"] - began, "right": right, "summary": diagnosis["summary"]}
    except (TimeoutError, AssertionError) as exc:
        return {"latency": None, "right": False, "summary": str(exc)[:300]}
    finally:
        if job is not None:
            job.stop()
        watch.stop()
        if crowd is not None:
            crowd.stop()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"hangwatch from {ROOT / 'hangwatch'}; load average {os.getloadavg()[0]:.2f}", flush=True)
    name = "bhi" + secrets.token_hex(2)
    lab, _ = Lab.up(name, nodes=2)
    latencies: dict[str, list[float]] = {way: [] for way in WAYS}
    wrong = 0
    port = 29900
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for round_ in range(args.runs):
                for way in WAYS:
                    port += 1
                    r = one(lab, way, port, Path(scratch))
                    wrong += not r["right"]
                    if r["latency"] is not None:
                        latencies[way].append(r["latency"])
                    shown = f"{r['latency']:.2f} s" if r["latency"] is not None else "-"
                    print(f"round {round_ + 1} {way:10} {shown:>8}  {'right' if r['right'] else 'WRONG'}  "
                          f"{r['summary'][:160]}", flush=True)
    finally:
        Lab.down(name)
    medians = {way: statistics.median(v) for way, v in latencies.items() if v}
    print(f"\n{args.runs} rounds in {time.monotonic() - started:.0f} s; verdicts wrong or missing: {wrong}")
    for way in WAYS:
        if way in medians:
            print(f"{way:10} median {medians[way]:6.2f} s  (of {len(latencies[way])}: "
                  f"{', '.join(f'{x:.2f}' for x in latencies[way])})")
    if "plain" in medians:
        for way in WAYS[1:]:
            if way in medians:
                print(f"{way} / plain: {medians[way] / medians['plain']:.2f}x "
                      f"({medians[way] - medians['plain']:+.2f} s)")
    return 0 if wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
