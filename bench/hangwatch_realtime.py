"""The watcher on the real clock: fed N ranks' agent messages at their real rate (a sample a second
from each node, the stacks it asks for answered at the next quarter second), with its own 4 Hz
ticker, as a live watch runs. bench/hangwatch_scale.py drives a simulated clock, which hides a
watcher that falls behind; this one does not (issue 36).

    .venv/bin/python bench/hangwatch_realtime.py [--sizes 512,4096] [--rounds 3]

Printed per size: the seconds from the fault to the verdict on the real clock against the same
messages on a driven clock at 8 ranks (the ratio is the figure: 1.00x is on time; a verdict waits
for a sample, so up to one sample interval, 1 s, late is the watcher's phase, not its cost), the
process's CPU until the verdict, and the box's load. The incident bundle is written as a live watch
writes it, beside the decision loop. The messages are the recording tests/unit/test_hangwatch_realtime.py
plays (tests/unit/artifacts/agent/leave.jsonl: rank 3 leaves the loop)."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "unit"))

import test_hangwatch_realtime as played  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="512,4096", help="ranks, multiples of 8")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        expected, _ = played.named_after_fault(1, False, Path(tmp) / "driven")
        print(f"driven clock, 8 ranks: named {expected:.2f} s after the fault")
        for ranks in (int(s) for s in args.sizes.split(",")):
            late, cpu = [], []
            for n in range(args.rounds):
                used = time.process_time()
                named, said = played.named_after_fault(ranks // 8, True, Path(tmp) / f"real{ranks}-{n}")
                cpu.append(time.process_time() - used)
                if named is None:
                    print(f"{ranks:6d} ranks, round {n + 1}: no verdict within 20 s of the fault")
                    continue
                culprits = said[0].snapshot.diagnosis.culprits
                late.append(named)
                print(f"{ranks:6d} ranks, round {n + 1}: named {named:.2f} s after the fault (culprits {culprits}); "
                      f"CPU {cpu[-1]:.1f} s; load {os.getloadavg()[0]:.1f}", flush=True)
            if late:
                median = statistics.median(late)
                print(f"{ranks:6d} ranks: real clock {median:.2f} s / driven {expected:.2f} s = {median / expected:.2f}x "
                      f"(median of {len(late)}; within one sample interval: <= {(expected + 1) / expected:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
