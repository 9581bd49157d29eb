"""Launch-to-first-step on a fresh 2-node lab, 2 processes per node: plain torchrun started over
ssh on both nodes at once (seed 002 by hand, without the tmux), against `ddp-preflight --launch
--no-probes` (its facts-only preflight, then torchrun on the same connections). Each is timed
from its start to the first "step N" line of any rank on this machine; preflight's share is the
time until the launcher says "launching". One extra round with the probes shows what they add.

Both lab nodes share this box's cores, so torch's imports (most of either figure) contend; the
ratio, not the seconds, is the figure to compare."""

from __future__ import annotations

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

NAME = "benchla"
ROUNDS = 3
NPROC = 2
TRAIN = REPO / "examples" / "train_ddp.py"
SCRIPT_ARGS = ["--steps", "5"]
STEP = re.compile(r"(^|\] )step \d+ ")


def first_step(procs: list[subprocess.Popen], started: float, timeout: float = 180) -> float:
    """Seconds from `started` to the first step line on any of the processes' stdout; every
    process is then read to its end."""
    seen: list[float] = []
    done = threading.Event()

    def read(proc):
        for line in proc.stdout:
            if STEP.search(line) and not done.is_set():
                seen.append(time.perf_counter() - started)
                done.set()
    readers = [threading.Thread(target=read, args=(p,), daemon=True) for p in procs]
    for r in readers:
        r.start()
    done.wait(timeout)
    for p in procs:
        p.wait(timeout)
    for r in readers:
        r.join(10)
    if not seen:
        raise SystemExit(f"no step line within {timeout:.0f} s (exit codes {[p.returncode for p in procs]})")
    return seen[0]


def plain_torchrun(lab: Lab) -> float:
    master = lab.node("master").ipv4
    started = time.perf_counter()
    procs = []
    for rank, node in enumerate(("master", "worker1")):
        command = (f"cd {shlex.quote(str(REPO))} && GLOO_SOCKET_IFNAME=eth0 {shlex.quote(sys.executable)} "
                   f"-m torch.distributed.run --nnodes 2 --nproc-per-node {NPROC} --node-rank {rank} "
                   f"--master-addr {master} --master-port 29500 {shlex.quote(str(TRAIN))} {shlex.join(SCRIPT_ARGS)}")
        procs.append(subprocess.Popen(["ssh", "-F", str(lab.ssh_config), node, command],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
    return first_step(procs, started)


def launcher(lab: Lab, *checks: str) -> tuple[float, float]:
    """(to the first step, to "launching": preflight's share)."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "ddp_preflight", "master", "worker1", "--ssh-config",
                             str(lab.ssh_config), *checks, "--launch", "--nproc-per-node", str(NPROC),
                             "--log-dir", f"/tmp/{NAME}-runs/{time.time_ns()}", "--", str(TRAIN), *SCRIPT_ARGS],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    launching: list[float] = []

    def read_stderr():
        for line in proc.stderr:
            if line.startswith("ddp-preflight: launching ") and not launching:
                launching.append(time.perf_counter() - started)
    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    step = first_step([proc], started)
    reader.join(10)
    if proc.returncode != 0 or not launching:
        raise SystemExit(f"ddp-preflight --launch failed (exit {proc.returncode})")
    return step, launching[0]


def main() -> int:
    lab, _ = Lab.up(NAME, nodes=2)
    try:
        plain, launched, shares = [], [], []
        for _ in range(ROUNDS):          # alternate, so both see the same machine load
            plain.append(plain_torchrun(lab))
            step, share = launcher(lab, "--no-probes")
            launched.append(step)
            shares.append(share)
        probes_step, probes_share = launcher(lab)
    finally:
        Lab.down(NAME)
    t, d, s = statistics.median(plain), statistics.median(launched), statistics.median(shares)
    print(f"launch-to-first-step: torchrun {t:.1f} s, ddp-preflight {d:.1f} s = {d / t:.2f} x "
          f"(median of {ROUNDS}; torchrun {', '.join(f'{x:.1f}' for x in plain)}; "
          f"ddp-preflight {', '.join(f'{x:.1f}' for x in launched)})")
    print(f"  preflight's share (facts and checks, until 'launching'): {s:.1f} s; "
          f"from 'launching' to the first step: {d - s:.1f} s against torchrun's {t:.1f} s")
    print(f"  with the probes too (one round): first step at {probes_step:.1f} s, of which preflight "
          f"{probes_share:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
