"""hangwatch's answer on a catalogue of program shapes, each run N times (default 10) on the lab:
per shape, how often the right rank was named alone, among the ranks it could not tell apart,
wrongly, not at all (silent), or a hang was named where there is none (false alarm); and how
fast, as a ratio to the shape's limit.

    python bench/hangwatch_kinds.py [--runs N] [--shapes leave,raise,...]

One 2-node lab. Attached shapes: one `hangwatch attach master worker1 --json --endless-after 20`
for the whole bench, and torchrun jobs of examples/hang_train.py (2 nodes x 2 ranks, or master
alone x 2) in turn, their output a pipe (nothing but the nodes' own evidence). Launched shapes:
`ddp-preflight master worker1 --launch`, the verdict read from the run's log folder (result.json;
a hang's bundle). Latency is the verdict's time minus the time the faulty rank printed its fault,
both this machine's clock (the lab's nodes share it).

The verdict's JSON: `culprits` (named) and `candidates` (one of them); the code before typed
verdicts had only `guilty` (one rank: named; several: candidates), and no reason."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ddp_preflight.hangwatch.stall import DEFAULT_THRESHOLD  # noqa: E402
from ddp_preflight.lab import Lab  # noqa: E402
from tests.lab.hangjob import NODES, Watch, hangwatch, start_job, wait_until  # noqa: E402

ENDLESS_AFTER = 20.0
SETTLE = 2.0                  # hangwatch judges a run's ends two samples after the last
HANGS = {"deadlock", "mismatch", "network-stall", "rendezvous-stall", "exited", "stall", "endless", "gpu-hang"}
EVERY = "every"               # the right answer names no culprit and every rank as a candidate


@dataclass(frozen=True)
class Shape:
    name: str
    args: tuple[str, ...]          # the job's fault options (the rank and step come per run)
    kind: str | None               # the verdict expected; None: a healthy run (no hang)
    reasons: tuple[str, ...] = ()  # any of these (the code before typed verdicts had none)
    limit: float = DEFAULT_THRESHOLD + 2      # seconds after the fault
    nodes: tuple[str, ...] = NODES
    launch: bool = False
    culprits: str = "rank"         # "rank": the faulty rank alone; EVERY: none, all candidates
    steps: int = 500
    watch_for: float = 0.0         # healthy shapes: how long nothing may be named
    quiet: bool = False            # healthy shapes: nothing at all may be named, not even a straggler
    members: int | None = None     # the faulty rank is one of ranks 0..members-1 (a subgroup's)
    options: tuple[str, ...] = ()  # launched shapes: ddp-preflight's own options
    kept: bool = False             # launched: the run keeps its first verdict (one bundle; result.json's
                                   # verdict names the same rank alone) whatever the hang causes after it


EXIT_LIMIT = SETTLE + 2
# The expected answers, all in this one table: (kind, reasons, culprits) per shape; kind None is a
# healthy run. The reason words are any of those listed (a verdict without a reason is not judged on it).
SHAPES = {s.name: s for s in (
    Shape("leave", ("--fault", "leave"), "deadlock", ("left-loop",)),
    Shape("work", ("--fault", "leave", "--wait", "work"), "deadlock", ("left-loop",)),
    Shape("future", ("--fault", "leave", "--wait", "future"), "deadlock", ("left-loop",)),
    Shape("child", ("--fault", "child"), "deadlock", ("left-loop",)),
    Shape("stuck", ("--fault", "stuck"), "deadlock", ("waits-on-lock",)),
    Shape("loader", ("--fault", "loader"), "held", ("waits-for-data",)),   # a deadlock only past the held bound
    Shape("stop", ("--fault", "stop"), "deadlock", ("stopped",)),
    Shape("recv", ("--fault", "recv"), "deadlock", ("wait-for-each-other",), culprits=EVERY),
    Shape("mismatch", ("--fault", "mismatch"), "mismatch", ("different-collective",)),
    Shape("exit", ("--fault", "exit"), "exited", ("exit-code",), EXIT_LIMIT),
    Shape("quit", ("--fault", "quit"), "exited", ("left-first", "killed"), EXIT_LIMIT),
    Shape("raise", ("--fault", "raise"), "exited", ("raised", "failed"), EXIT_LIMIT),
    Shape("raise-1node", ("--fault", "raise"), "exited", ("raised", "failed"), EXIT_LIMIT, nodes=("master",)),
    Shape("kill", ("--fault", "kill"), "exited", ("killed",), EXIT_LIMIT),
    Shape("launch-raise", ("--fault", "raise"), "exited", ("raised",), EXIT_LIMIT + 2, launch=True),
    Shape("launch-raise-1node", ("--fault", "raise"), "exited", ("raised",), EXIT_LIMIT + 2, nodes=("master",),
          launch=True),
    # A subgroup's all_reduce skipped by one of its two members: named for that group, never the
    # other member "behind" by the default group's numbers.
    Shape("launch-subgroup", ("--fault", "subgroup"), "mismatch", ("skipped-group",), launch=True, members=2,
          options=("--stop-on-hang",), kept=True),
    # A timeout cascade: the others' collectives time out 20 s into the rank's sleep, they exit,
    # torchrun stops the rest; the hang named first stays the run's verdict.
    Shape("launch-cascade", ("--fault", "sleep", "--seconds", "60", "--pg-timeout", "20"), "deadlock",
          ("sleeps",), launch=True, kept=True),
    # ddp-preflight's own freeze (SIGSTOP) and stop of a deadlocked run: one verdict, one bundle.
    Shape("launch-stop", ("--fault", "leave"), "deadlock", ("left-loop",), launch=True, options=("--stop-on-hang",),
          kept=True),
    Shape("endless", ("--fault", "endless"), "endless", ("computes-forever",), ENDLESS_AFTER + DEFAULT_THRESHOLD + 2),
    # Issue 27's shapes, attached (the launched ones above): asleep inside its loop (not "left the
    # loop"), out of batches in its final barrier (uneven data), a subgroup's collective skipped,
    # and a timeout cascade whose first verdict is the one judged.
    Shape("sleep", ("--fault", "sleep", "--seconds", "600"), "deadlock", ("sleeps",)),
    Shape("drained", ("--fault", "drained"), "mismatch", ("different-collective",)),
    Shape("subgroup", ("--fault", "subgroup"), "mismatch", ("skipped-group",), members=2),
    Shape("cascade", ("--fault", "sleep", "--seconds", "60", "--pg-timeout", "20"), "deadlock", ("sleeps",)),
    # The rank prints its fault instead of init_process_group; the others wait there.
    Shape("skip-init", ("--fault", "skip-init"), "rendezvous-stall", ("never-checked-in",)),
    # Longer than the threshold (the others wait past it), shorter than --endless-after: it arrives.
    # A straggler said is fine; a hang is a false alarm.
    Shape("straggle", ("--fault", "straggle", "--seconds", "15"), None, watch_for=30, steps=60),
    # Nothing is wrong: a hang is a false alarm, any other verdict (a straggler, a notice) is wrong.
    Shape("shell", ("--fault", "shell"), None, watch_for=30, steps=200, quiet=True),
)}
RANKS = [(3, 5), (1, 9), (0, 6), (2, 12), (1, 4), (2, 8), (3, 15), (0, 10), (3, 7), (1, 11)]


def named(diagnosis: dict) -> tuple[list[int], list[int]]:
    """(culprits, candidates), from the typed verdict or the old `guilty`."""
    if "culprits" in diagnosis:
        return list(diagnosis["culprits"]), list(diagnosis.get("candidates") or [])
    guilty = list(diagnosis.get("guilty") or [])
    return (guilty, []) if len(guilty) == 1 else ([], guilty)


def judge(shape: Shape, diagnosis: dict | None, rank: int, world: int) -> tuple[str, str]:
    """(right | among | wrong | silent, why) for one run's first verdict of a hang."""
    if diagnosis is None:
        return "silent", "nothing named"
    culprits, candidates = named(diagnosis)
    why = f"{diagnosis['kind']} culprits {culprits} candidates {candidates} reason {diagnosis.get('reason')}: " \
          f"{diagnosis['summary']}"
    if diagnosis["kind"] != shape.kind:
        return "wrong", why
    reason = diagnosis.get("reason")
    if reason is not None and shape.reasons and reason not in shape.reasons:
        return "wrong", why
    if shape.culprits == EVERY:
        if not culprits and sorted(candidates) == list(range(world)):
            return "right", ""
        return "wrong", why
    if culprits == [rank] and not candidates:
        return "right", ""
    if not culprits and rank in candidates:
        return "among", why
    return "wrong", why


def judge_healthy(shape: Shape, events: list[dict]) -> tuple[str, str]:
    """(right | wrong | false-alarm, why) for a healthy run: every verdict said while it ran."""
    for e in events:
        diagnosis = (e.get("snapshot") or {}).get("diagnosis") or {}
        if e["event"] == "diagnosis" or diagnosis.get("kind") in HANGS:
            return "false-alarm", f"{diagnosis.get('kind')}: {diagnosis.get('summary') or e['text']}"
    if shape.quiet:
        said = [e for e in events if e["event"] == "straggler" or (e.get("snapshot") or {}).get("diagnosis")]
        if said:
            return "wrong", f"{said[0]['event']}: {said[0]['text']}"
    return "right", ""


def one_attached(lab: Lab, watch: Watch, shape: Shape, port: int, rank: int, step: int) -> dict:
    mark = len(watch.events)
    ranks = 2 * len(shape.nodes)
    faulty = rank % (shape.members or ranks)
    job = start_job(lab, "--steps", str(shape.steps), *shape.args, "--rank", str(faulty), "--at", str(step),
                    port=port, nodes=shape.nodes)
    out = {"latency": None}
    try:
        try:
            began = job.fault_time(120)
        except AssertionError:
            return {**out, "result": "silent", "why": "the job never reached its fault"}
        early = [e for e in watch.events[mark:] if e["event"] == "diagnosis" and e["time"] < began]
        if early:
            return {**out, "result": "false-alarm", "why": f"before the fault: {early[0]['text']}"}
        if shape.kind is None:
            deadline = time.time() + shape.watch_for
            while time.time() < deadline and all(p.poll() is None for p in job.procs):
                time.sleep(0.5)
            time.sleep(SETTLE + 1)
            result, why = judge_healthy(shape, watch.events[mark:])
            return {**out, "result": result, "why": why}
        try:
            event = wait_until(lambda: next((e for e in watch.events[mark:] if e["event"] == "diagnosis"
                                             and e["time"] >= began), None), shape.limit + 30, "no diagnosis")
        except TimeoutError:
            return {**out, "result": "silent", "why": f"nothing named within {shape.limit + 30:.0f} s"}
        result, why = judge(shape, event["snapshot"]["diagnosis"], faulty, ranks)
        return {"latency": event["time"] - began, "result": result, "why": why}
    finally:
        job.stop()
        time.sleep(SETTLE + 1)         # the stop's own exits land in this run's window


def one_launched(lab: Lab, shape: Shape, port: int, rank: int, step: int, folder: Path) -> dict:
    ranks = 2 * len(shape.nodes)
    faulty = rank % (shape.members or ranks)
    log_dir = folder / f"run-{port}"
    argv = [sys.executable, "-m", "ddp_preflight.cli.ddp_preflight", *shape.nodes, "--ssh-config", str(lab.ssh_config),
            "--launch", "--nproc-per-node", "2", "--no-probes", "--master-port", str(port), "--log-dir", str(log_dir),
            *shape.options, "--", str(ROOT / "examples" / "hang_train.py"), "--steps", str(shape.steps), *shape.args,
            "--rank", str(faulty), "--at", str(step)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
    headline = next((line for line in done.stderr.splitlines() if "training failed" in line),
                    (done.stderr.strip().splitlines() or ["(no output)"])[-1])
    fault = [line for line in done.stdout.splitlines() if "FAULT" in line]
    began = float(fault[0].rsplit(" at ", 1)[1]) if fault else None
    bundles = sorted((log_dir / "incidents").glob("*/incident.json")) if (log_dir / "incidents").is_dir() else []
    if not bundles:
        return {"latency": None, "result": "silent", "why": f"no verdict ({headline})"}
    snapshot = json.loads(bundles[0].read_text())["snapshot"]
    if began is None:
        return {"latency": None, "result": "silent", "why": f"the job never reached its fault | {headline}"}
    if snapshot["time"] < began:
        return {"latency": None, "result": "false-alarm",
                "why": f"before the fault: {snapshot['diagnosis']['summary']} | {headline}"}
    result, why = judge(shape, snapshot["diagnosis"], faulty, ranks)
    if result == "right" and shape.kept:
        kept = json.loads((log_dir / "result.json").read_text()).get("verdict") if (log_dir / "result.json").is_file() \
            else None
        if len(bundles) != 1 or kept is None or (kept.get("culprits"), kept.get("candidates")) != ([faulty], []):
            result, why = "wrong", (f"{len(bundles)} bundles; result.json's verdict: "
                                    f"{kept and (kept.get('kind'), kept.get('culprits'), kept.get('candidates'))}")
    return {"latency": snapshot["time"] - began, "result": result, "why": f"{why} | {headline}".lstrip(" |")}


def main() -> int:
    if "--attach" in sys.argv[1:]:
        # Attach mode: torchruns started by hand, output to files (bench/hangwatch_attach.py).
        from bench.hangwatch_attach import main as attach
        return attach([a for a in sys.argv[1:] if a != "--attach"])
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    args = parser.parse_args()
    shapes = [SHAPES[s] for s in args.shapes.split(",")]
    started = time.monotonic()
    print(f"hangwatch from {Path(sys.modules['hangwatch.stall'].__file__).parent}; load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    name = "bhk" + secrets.token_hex(2)
    lab, _ = Lab.up(name, nodes=2)
    table = []
    port = 29800
    try:
        with tempfile.TemporaryDirectory() as scratch:
            # The attached shapes' watcher, only where one is run: beside a launch it would be a second
            # tracer of the launched ranks (its py-spy holds them in state t), which is not their shape.
            attached = any(not shape.launch for shape in shapes)
            watch = hangwatch(lab, "--incident-dir", scratch, "--endless-after", str(ENDLESS_AFTER),
                              "--keep-watching") if attached else None
            try:
                if watch is not None:
                    wait_until(lambda: {e.get("node") for e in watch.events if e["event"] == "node"
                                        and e.get("status") == "watching"} >= set(NODES), 60,
                               "the agents did not start")
                for shape in shapes:
                    runs = []
                    for rank, step in RANKS[:args.runs]:
                        port += 1
                        if shape.launch:
                            r = one_launched(lab, shape, port, rank, step, Path(scratch))
                        else:
                            assert watch is not None
                            r = one_attached(lab, watch, shape, port, rank, step)
                        runs.append(r)
                        shown = f"{r['latency']:.2f} s" if r["latency"] is not None else "-"
                        print(f"{shape.name:18} rank {rank % (shape.members or 2 * len(shape.nodes))} at step {step:2}: "
                              f"{r['result']:11} {shown:>8}  {r['why'][:400]}", flush=True)
                    table.append((shape, runs))
            finally:
                if watch is not None:
                    watch.stop()
    finally:
        Lab.down(name)
    print()
    print(f"{'shape':18}  right  among  wrong  silent  false-alarm   latency median/max (limit)")
    ok = True
    for shape, runs in table:
        counts = {k: sum(r["result"] == k for r in runs) for k in ("right", "among", "wrong", "silent", "false-alarm")}
        latencies = [r["latency"] for r in runs if r["latency"] is not None]
        ok &= counts["right"] == len(runs)
        late = (f"{statistics.median(latencies):5.1f} / {max(latencies):5.1f} s = {max(latencies) / shape.limit:.2f}x "
                f"({shape.limit:.0f} s)" if latencies and shape.kind else "-")
        print(f"{shape.name:18}  {counts['right']:2}/{len(runs):<2}  {counts['among']:5}  {counts['wrong']:5}  "
              f"{counts['silent']:6}  {counts['false-alarm']:11}   {late}")
    print(f"\n{len(table)} shapes x {args.runs} runs in {(time.monotonic() - started) / 60:.1f} min; load average "
          f"{os.getloadavg()[0]:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
