"""`ddp-preflight --launch` WITH its probes against a hand-started torchrun of the same 2x2
training (2 lab nodes, 2 processes per node), alternated round by round so both meet the same
load on this box. Each is timed from its start to the first "step N" line of any rank and to its
end; preflight's own share is the time until the launcher says "launching". The ratio of the
medians is the figure (issue 36's goal: at most 1.3x); the seconds depend on the box's load.

    .venv/bin/python bench/launch_overhead.py [--rounds N]

With `-v` the launcher prints its own time per stage; those lines are shown for the last round."""

from __future__ import annotations

import argparse
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ddp_preflight.lab import Lab  # noqa: E402

NAME = "benchlo"
NPROC = 2
TRAIN = REPO / "examples" / "train_ddp.py"
SCRIPT_ARGS = ["--steps", "5"]
STEP = re.compile(r"(^|\] )step \d+ ")
TIMEOUT = 400.0


def timed(procs: list[subprocess.Popen], started: float, on_err=None) -> tuple[float, float]:
    """(seconds to the first step line on any process's stdout, seconds until every process ended)."""
    seen: list[float] = []
    lock = threading.Lock()

    def read(stream, handler):
        for line in stream:
            handler(line)

    def out(line):
        with lock:
            if STEP.search(line) and not seen:
                seen.append(time.perf_counter() - started)
    readers = [threading.Thread(target=read, args=(p.stdout, out), daemon=True) for p in procs]
    readers += [threading.Thread(target=read, args=(p.stderr, on_err), daemon=True)
                for p in procs if on_err and p.stderr]
    for r in readers:
        r.start()
    for p in procs:
        p.wait(TIMEOUT)
    ended = time.perf_counter() - started
    for r in readers:
        r.join(10)
    if not seen:
        raise SystemExit(f"no step line within {TIMEOUT:.0f} s (exit codes {[p.returncode for p in procs]})")
    return seen[0], ended


def hand_torchrun(lab: Lab) -> tuple[float, float]:
    master = lab.node("master").ipv4
    started = time.perf_counter()
    procs = []
    for rank, node in enumerate(("master", "worker1")):
        command = (f"cd {shlex.quote(str(REPO))} && GLOO_SOCKET_IFNAME=eth0 {shlex.quote(sys.executable)} "
                   f"-m torch.distributed.run --nnodes 2 --nproc-per-node {NPROC} --node-rank {rank} "
                   f"--master-addr {master} --master-port 29500 {shlex.quote(str(TRAIN))} {shlex.join(SCRIPT_ARGS)}")
        procs.append(subprocess.Popen(["ssh", "-F", str(lab.ssh_config), node, command],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
    return timed(procs, started)


def with_preflight(lab: Lab, verbose: bool) -> tuple[float, float, float, list[str]]:
    """(to the first step, to the end, to "launching": preflight's share, the -v stage lines)."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "ddp_preflight", "master", "worker1", "--ssh-config",
                             str(lab.ssh_config), *(["-v"] if verbose else []), "--launch",
                             "--nproc-per-node", str(NPROC), "--log-dir", f"/tmp/{NAME}-runs/{time.time_ns()}",
                             "--", str(TRAIN), *SCRIPT_ARGS],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    launching: list[float] = []
    stages: list[str] = []

    def err(line):
        if line.startswith("ddp-preflight: launching ") and not launching:
            launching.append(time.perf_counter() - started)
        if line.startswith("ddp-preflight: stage "):
            stages.append(line.rstrip())
    step, end = timed([proc], started, err)
    if proc.returncode != 0 or not launching:
        raise SystemExit(f"ddp-preflight --launch failed (exit {proc.returncode})")
    return step, end, launching[0], stages


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("-v", action="store_true", help="pass -v to the launcher: its time per stage")
    args = parser.parse_args()
    lab, _ = Lab.up(NAME, nodes=2)
    plain: list[tuple[float, float]] = []
    launched: list[tuple[float, float, float]] = []
    stages: list[str] = []
    try:
        for n in range(args.rounds):          # alternate, so both see the same machine load
            plain.append(hand_torchrun(lab))
            step, end, share, stages = with_preflight(lab, args.v)
            launched.append((step, end, share))
            print(f"round {n + 1}: torchrun first step {plain[-1][0]:.1f} s, end {plain[-1][1]:.1f} s; "
                  f"--launch first step {step:.1f} s, end {end:.1f} s, preflight {share:.1f} s", flush=True)
    finally:
        Lab.down(NAME)
    t_step, t_end = (statistics.median(x[i] for x in plain) for i in (0, 1))
    d_step, d_end, share = (statistics.median(x[i] for x in launched) for i in (0, 1, 2))
    print(f"first step: torchrun {t_step:.1f} s, --launch with probes {d_step:.1f} s = {d_step / t_step:.2f}x "
          f"(median of {args.rounds}; goal <= 1.3x)")
    print(f"whole run:  torchrun {t_end:.1f} s, --launch with probes {d_end:.1f} s = {d_end / t_end:.2f}x")
    print(f"  preflight's share (facts, probes, checks: until 'launching'): {share:.1f} s")
    for line in stages:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
