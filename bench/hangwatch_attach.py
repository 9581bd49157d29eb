"""hangwatch_kinds.py's attach mode: `hangwatch attach` on torchruns started by hand, as users start
them, their output where users send it: one file per node (`torchrun ... > node.log 2>&1` from a
shell) or torchrun's per-rank files (`--log-dir DIR --redirects 3`). Per shape and output, how
often the right ranks were named alone (right), wrongly, not at all (silent), or a hang was named
in a healthy run (false alarm); and, for healthy runs, whether the watch ended by itself.

    python bench/hangwatch_attach.py [--runs 3] [--shapes healthy,segv,memory,value]
    python bench/hangwatch_kinds.py --attach [--runs 3]

One 2-node lab; each run is 2 nodes x 2 ranks of tests/lab/attach_train.py, started by hand on
both nodes, then one `hangwatch attach master worker1 --json` for that run alone. The job trains
until every rank is found, then the fault (or the end). A run's answer is the watch's first
diagnosis; a healthy run is right when nothing is named and the watch ends by itself with every
rank's exit 0 (code before it never ended: it is stopped 10 s after the run, and judged on what
it named). Works on any version of hangwatch attach (--json's events only)."""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ddp_preflight.lab import Lab  # noqa: E402
from tests.lab.hangjob import hangwatch, wait_until  # noqa: E402
from tests.lab.test_attach_lab import start_by_hand  # noqa: E402

AFTER = 10.0          # seconds a watch that does not end by itself is given after its run ended


@dataclass(frozen=True)
class Shape:
    name: str
    fault: str | None
    ranks: tuple[int, ...] = ()    # the faulty ranks: the culprits expected


SHAPES = {s.name: s for s in (Shape("healthy", None), Shape("segv", "segv", (1,)), Shape("memory", "memory", (2,)),
                              Shape("value", "value", (0, 3)))}
OUTPUTS = ("node-file", "per-rank")


def one(lab: Lab, shape: Shape, per_rank: bool, port: int, folder: Path) -> dict:
    args = ("--fault", shape.fault, "--rank", ",".join(map(str, shape.ranks))) if shape.fault else ()
    run = start_by_hand(lab, folder / f"run-{port}", port, *args, per_rank=per_rank)
    watch = hangwatch(lab, "--incident-dir", str(folder / f"incidents-{port}"))
    ended_itself = False
    try:
        wait_until(lambda: len({e["rank"] for e in watch.events if e["event"] == "rank-found"}) >= 4, 120,
                   "the ranks were not found")
        began = time.time()
        run.go.touch()
        codes = run.wait(120)
        deadline = time.monotonic() + AFTER
        while time.monotonic() < deadline and watch.proc.poll() is None:
            time.sleep(0.2)
        ended_itself = watch.proc.poll() is not None
    except TimeoutError as exc:
        return {"result": "silent", "why": str(exc), "latency": None}
    finally:
        code = watch.stop()
        run.stop()
    said = [e for e in watch.events if e["event"] == "diagnosis"]
    if shape.fault is None:
        if said:
            return {"result": "false-alarm", "why": said[0]["text"], "latency": None}
        if not ended_itself or code != 0 or codes != [0, 0]:
            return {"result": "wrong", "why": f"the watch did not end by itself with exit 0 (exit {code}, "
                    f"torchruns {codes}): {[e['text'] for e in watch.events][-3:]}", "latency": None}
        return {"result": "right", "why": "", "latency": None}
    if not said:
        return {"result": "silent", "why": "nothing named", "latency": None}
    d = said[0]["snapshot"]["diagnosis"]
    latency = said[0]["time"] - began
    if (d["culprits"], d.get("candidates") or []) == (list(shape.ranks), []):
        return {"result": "right", "why": "", "latency": latency}
    return {"result": "wrong", "why": f"{d['kind']} culprits {d['culprits']} candidates {d.get('candidates')}: "
            f"{d['summary']}", "latency": latency}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    args = parser.parse_args(argv)
    started = time.monotonic()
    print(f"hangwatch attach from {ROOT}; load average {os.getloadavg()[0]:.2f}", flush=True)
    name = "bha" + secrets.token_hex(2)
    lab, _ = Lab.up(name, nodes=2)
    table = []
    port = 29760
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for shape in (SHAPES[s] for s in args.shapes.split(",")):
                for output in OUTPUTS:
                    runs = []
                    for _ in range(args.runs):
                        port += 1
                        r = one(lab, shape, output == "per-rank", port, Path(scratch))
                        runs.append(r)
                        late = f"{r['latency']:.2f} s" if r["latency"] is not None else "-"
                        print(f"{shape.name:8} {output:9}: {r['result']:11} {late:>8}  {r['why'][:300]}", flush=True)
                    table.append((shape, output, runs))
    finally:
        Lab.down(name)
    print(f"\n{'shape':8} {'output':9}  right  wrong  silent  false-alarm")
    ok = True
    for shape, output, runs in table:
        counts = {k: sum(r["result"] == k for r in runs) for k in ("right", "wrong", "silent", "false-alarm")}
        ok &= counts["right"] == len(runs)
        print(f"{shape.name:8} {output:9}  {counts['right']:2}/{len(runs):<2}  {counts['wrong']:5}  {counts['silent']:6}  "
              f"{counts['false-alarm']:11}")
    print(f"\n{len(table)} shapes x {args.runs} runs in {(time.monotonic() - started) / 60:.1f} min; load average "
          f"{os.getloadavg()[0]:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
