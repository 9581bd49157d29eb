"""A soak (issue 35): healthy 2-node x 2-rank Gloo runs of tests/lab/soak_train.py on the lab, with
every wait a healthy run has (uneven step times of 0.05-6 s, a slow straggler that sleeps 4 s a
step, a 60 s rank-0 checkpoint while the others wait in barrier(), data-loader pauses, periodic
evaluation), watched by hangwatch under `ddp-preflight --launch --stop-on-hang` and under
`hangwatch attach`. The answer must be: zero hang verdicts, and the run finishes.

    python bench/soak.py [--minutes M] [--modes launch,attach] [--out FILE]

Each mode trains for M minutes (rank 0's clock decides when to stop), one mode after the other,
on one lab. Counted per mode: the hang verdicts said (DIAGNOSIS events, bundles), the verdicts
that are no hang (held: a rank asleep in its code, said as likely; straggler), 'progress resumed',
the steps, the checkpoints, how the run ended and the load average."""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ddp_preflight.lab import Lab  # noqa: E402
from tests.lab.hangjob import NODES, hangwatch, start_job, wait_until  # noqa: E402

SOAK = ROOT / "tests" / "lab" / "soak_train.py"
STOP_WAIT = 15.0      # s: a watch not ended this long after SIGINT is a defect (issue 35)
HANGWORD = re.compile(r"^ddp-preflight: hangwatch: ([A-Z-]+): ")


def shapes(minutes: float) -> list[str]:
    return ["--minutes", str(minutes), "--uneven", "0.05,6", "--straggler", "1", "--straggle", "4",
            "--checkpoint-every", "25", "--checkpoint-seconds", "60", "--eval-every", "10", "--eval-seconds", "3",
            "--loader-pause-every", "15", "--loader-pause", "5"]


def launched(lab: Lab, minutes: float, folder: Path, port: int) -> dict:
    log_dir = folder / "launch"
    argv = [sys.executable, "-m", "ddp_preflight.cli.ddp_preflight", *NODES, "--ssh-config", str(lab.ssh_config), "--launch",
            "--nproc-per-node", "2", "--no-probes", "--stop-on-hang", "--master-port", str(port),
            "--log-dir", str(log_dir), "--", str(SOAK), *shapes(minutes)]
    began = time.time()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=minutes * 60 + 900, cwd=ROOT)
    own = [line for line in done.stderr.splitlines() if line.startswith("ddp-preflight: hangwatch: ")]
    hangs = [line for line in own if HANGWORD.match(line)]
    bundles = sorted((log_dir / "incidents").glob("*/incident.json")) if (log_dir / "incidents").is_dir() else []
    result = json.loads((log_dir / "result.json").read_text()) if (log_dir / "result.json").is_file() else {}
    return {"mode": "launch --stop-on-hang", "seconds": time.time() - began, "exit": done.returncode,
            "hangs": hangs, "bundles": len(bundles), "verdict": result.get("verdict"),
            "held": [line for line in own if " likely a stall (" in line],
            "stragglers": [line for line in own if "not a hang:" in line],
            "resumed": sum("progress resumed" in line for line in own),
            "steps": _steps(done.stdout), "checkpoints": done.stdout.count("FAULT checkpoint"),
            "finished": "ddp-preflight: training finished" in done.stderr,
            "tail": [line for line in done.stderr.splitlines() if not line.startswith("[")][-6:]}


def attached(lab: Lab, minutes: float, folder: Path, port: int) -> dict:
    watch = hangwatch(lab, "--incident-dir", str(folder / "attach-incidents"), "--keep-watching")
    began = time.time()
    try:
        wait_until(lambda: {e.get("node") for e in watch.events if e["event"] == "node"
                            and e.get("status") == "watching"} >= set(NODES), 120, "the agents did not start")
        job = start_job(lab, *shapes(minutes), port=port, script=SOAK)
        try:
            codes = job.wait(minutes * 60 + 900)
        finally:
            job.stop()
        time.sleep(5)                     # the ends settle (two samples), then the watch is stopped
    finally:
        code, ended_in, stacks = _interrupted(watch)
        watch.stop()
    kinds = Counter(e["event"] for e in watch.events)
    said = [e for e in watch.events if (e.get("snapshot") or {}).get("diagnosis")]
    lines = [line for _, line in job.lines]
    return {"mode": "attach", "seconds": time.time() - began, "exit": codes, "watch_exit": code,
            "hangs": [e["text"] for e in watch.events if e["event"] == "diagnosis"], "bundles": kinds["incident"],
            "held": [e["text"] for e in said if e["snapshot"]["diagnosis"]["kind"] == "held"],
            "stragglers": [e["text"] for e in said if e["snapshot"]["diagnosis"]["kind"] == "straggler"],
            "resumed": kinds["resumed"], "steps": _steps("\n".join(lines)),
            "checkpoints": sum("FAULT checkpoint" in line for line in lines),
            "finished": codes == [0, 0], "watch_end_s": ended_in, "watch_stacks": stacks}


def _interrupted(watch) -> tuple[int, float, str | None]:
    """SIGINT to `hangwatch attach`, as a person's Ctrl-C: its exit code and how long it took to end.
    One that has not ended in STOP_WAIT s is read by py-spy (where each of its threads waits: the
    evidence of why), then killed (-9)."""
    began = time.monotonic()
    watch.proc.send_signal(signal.SIGINT)
    try:
        return watch.proc.wait(STOP_WAIT), time.monotonic() - began, None
    except subprocess.TimeoutExpired:
        spy = Path(sys.executable).with_name("py-spy")
        dump = subprocess.run([str(spy), "dump", "--pid", str(watch.proc.pid)], capture_output=True, text=True,
                              timeout=60)
        watch.proc.kill()
        watch.proc.wait()
        return -9, time.monotonic() - began, dump.stdout + dump.stderr


def _steps(stdout: str) -> int:
    found = [int(m.group(1)) for m in re.finditer(r"done rank \d+ steps (\d+)", stdout)]
    return max(found, default=0)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--modes", default="launch,attach")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    name = "soak" + secrets.token_hex(2)
    report = [f"soak: {args.minutes:g} min per mode ({args.modes}), tests/lab/soak_train.py {' '.join(shapes(args.minutes))}",
              f"started {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load average {os.getloadavg()[0]:.2f}"]
    print("\n".join(report), flush=True)
    lab, _ = Lab.up(name, nodes=2)
    ok = True
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for i, mode in enumerate(args.modes.split(",")):
                run = (launched if mode == "launch" else attached)(lab, args.minutes, Path(scratch), 29900 + i)
                clean = not run["hangs"] and not run["bundles"] and run["finished"]
                ok = ok and clean
                lines = [f"{run['mode']}: {'PASS' if clean else 'FAIL'}: {len(run['hangs'])} hang verdicts, "
                         f"{run['bundles']} bundles; {run['steps']} steps, {run['checkpoints']} checkpoints of 60 s, "
                         f"{run['seconds'] / 60:.1f} min; {len(run['held'])} likely stalls said (held, no hang), "
                         f"{len(run['stragglers'])} straggler notices, {run['resumed']} 'progress resumed'; "
                         f"exit {run['exit']}{', watch exit ' + str(run['watch_exit']) if 'watch_exit' in run else ''}; "
                         f"load average {os.getloadavg()[0]:.2f}"]
                lines += [f"    hang: {h}" for h in run["hangs"]]
                lines += [f"    held: {h}" for h in run["held"][:5]]
                lines += [f"    {t}" for t in run.get("tail", []) if not clean]
                if "watch_end_s" in run:
                    lines.append(f"    the watch ended {run['watch_end_s']:.1f} s after SIGINT (exit {run['watch_exit']})")
                if run.get("watch_stacks"):
                    lines += [f"    {t}" for t in run["watch_stacks"].splitlines()]
                print("\n".join(lines), flush=True)
                report += lines
    finally:
        Lab.down(name)
    report.append(f"ended {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}: {'zero hang verdicts' if ok else 'FAIL'}")
    print(report[-1])
    if args.out:
        Path(args.out).write_text("\n".join(report) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
