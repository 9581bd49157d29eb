"""What the Flight Recorder under --launch costs the training (limit: at most 1% of its
throughput), measured A/B in one run.

`ddp-preflight master worker1 --launch` (facts-only preflight, 2 lab nodes x 2 ranks, Gloo)
runs examples/hang_train.py in interleaved blocks (off, on, on, off, ...: a drift of the machine
hits both alike), each a fresh launch:
- on: the default; every rank runs through the bootstrap (its answering thread looks for a
  request twice a second) and torch records every collective (TORCH_FR_BUFFER_SIZE=2000);
- off: `--no-flight-recorder --env TORCH_FR_BUFFER_SIZE=0`: no bootstrap, and no recording at all
  (torch 2.13 records 2000 collectives by default: --no-flight-recorder alone leaves that on).
Each block is measured once rank 0 has stepped and settled, so the start is not counted. steps/s
comes from rank 0's step lines, stamped as they arrive. The step is short (--step-time 0.01: about
ten times the default's collectives a second), so that a cost per collective shows.

The lab nodes are network namespaces on this box: they share its 2 cores with each other and with
whatever else runs here; the pairs' scatter says how far the box's noise lets the figure go."""

from __future__ import annotations

import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ddp_preflight.lab import Lab  # noqa: E402

PAIRS = 3                  # blocks: off, on, on, off, ... (2 * PAIRS blocks)
BLOCK = 20.0               # seconds measured per block
SETTLE = 5.0               # seconds after rank 0's first steps before a block is measured
PORT = 29792
LIMIT = 0.01
SCRIPT = ROOT / "examples" / "hang_train.py"
STEP = re.compile(r"^\[master r0\] step (\d+) loss")
OFF = ("--no-flight-recorder", "--env", "TORCH_FR_BUFFER_SIZE=0")


def recorded_ranks(lab: Lab) -> int:
    """Ranks on the lab's nodes whose environment has the run's Flight Recorder folder."""
    found = 0
    for node in ("master", "worker1"):
        for pid in lab.processes(node):
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes()
                argv = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"hang_train.py" in argv and b"\0RANK=" in b"\0" + env and b"DDP_PREFLIGHT_FLIGHT_RECORDER=" in env:
                found += 1
    return found


def wait_until_gone(lab: Lab, timeout: float = 30) -> None:
    """The run's ranks gone from both nodes: the next launch's preflight would see them as stale."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(b"hang_train.py" in _cmdline(pid) for node in ("master", "worker1") for pid in lab.processes(node)):
            return
        time.sleep(0.5)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def block(lab: Lab, on: bool, port: int, logs: str) -> dict:
    """One launch, measured for BLOCK seconds once it steps, then stopped with Ctrl-C."""
    steps: list[tuple[float, int]] = []
    said = open(f"{logs}/{port}.stderr", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "ddp_preflight", "master", "worker1", "--ssh-config",
                             str(lab.ssh_config), "--no-probes", "--launch", "--nproc-per-node", "2",
                             "--master-port", str(port), "--log-dir", f"{logs}/{port}", *(() if on else OFF),
                             "--", str(SCRIPT), "--steps", "100000000", "--step-time", "0.01"],
                            stdout=subprocess.PIPE, stderr=said, text=True, cwd=ROOT)

    def read():
        for line in proc.stdout:
            m = STEP.match(line)
            if m:
                steps.append((time.time(), int(m.group(1))))
    threading.Thread(target=read, daemon=True).start()
    try:
        deadline = time.monotonic() + 180
        while len(steps) < 20:
            if time.monotonic() > deadline or proc.poll() is not None:
                said.seek(0)
                raise SystemExit(f"the launched training did not step (exit {proc.poll()}):\n{said.read()[-3000:]}")
            time.sleep(0.2)
        time.sleep(SETTLE)
        recorded = recorded_ranks(lab)
        start = time.time()
        time.sleep(BLOCK)
        end = time.time()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
        said.close()
        wait_until_gone(lab)
    inside = [(t, n) for t, n in steps if start <= t <= end]
    rate = (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0]) if len(inside) > 1 else 0.0
    return {"on": on, "rate": rate, "recorded": recorded, "seconds": end - start}


def main() -> int:
    name = "bfr" + secrets.token_hex(2)
    lab, _ = Lab.up(name, nodes=2)
    blocks: list[dict] = []
    logs = tempfile.mkdtemp(prefix="ddp-preflight-bench-fr-")
    try:
        for i in range(2 * PAIRS):
            on = i % 4 in (1, 2)
            b = block(lab, on, PORT + i, logs)
            blocks.append(b)
            print(f"block {i + 1}: Flight Recorder {'on ' if on else 'off'}: {b['rate']:.2f} steps/s over "
                  f"{b['seconds']:.1f} s; ranks with the run's Flight Recorder folder: {b['recorded']} of 4",
                  flush=True)
    finally:
        Lab.down(name)
        print(f"each launch's logs and stderr: {logs}")
    return report(blocks)


def report(blocks: list[dict]) -> int:
    on, off = [b for b in blocks if b["on"]], [b for b in blocks if not b["on"]]
    r_on, r_off = statistics.mean(b["rate"] for b in on), statistics.mean(b["rate"] for b in off)
    ratio = r_on / r_off
    # Blocks pair up in order, (1,2), (3,4), ...: on/off in each; their scatter is the box's noise.
    pairs = [(a if a["on"] else b)["rate"] / (b if a["on"] else a)["rate"]
             for a, b in zip(blocks[::2], blocks[1::2], strict=False)]
    error = statistics.stdev(pairs) / len(pairs) ** 0.5 if len(pairs) > 1 else float("inf")
    verdict = "INCONCLUSIVE" if error > LIMIT / 2 else "OK" if 1 - ratio <= LIMIT else "OVER LIMIT"
    print(f"throughput: Flight Recorder off {r_off:.2f} steps/s, on {r_on:.2f} steps/s (mean of {len(off)} and "
          f"{len(on)} blocks of {BLOCK:.0f} s); on = {ratio:.3f}x of off = {(1 - ratio) * 100:.1f}% overhead "
          f"+- {error * 100:.1f}% (limit {LIMIT * 100:.0f}%) {verdict}")
    print(f"  pair ratios (on/off, blocks in order) {', '.join(f'{p:.3f}' for p in pairs)}")
    wrong = [b for b in blocks if b["recorded"] != (4 if b["on"] else 0)]
    if wrong:
        print(f"  {len(wrong)} block(s) did not run as labelled (ranks with the folder: "
              f"{[b['recorded'] for b in wrong]}): the figure does not stand")
        return 1
    return 0 if verdict != "OVER LIMIT" else 1


if __name__ == "__main__":
    sys.exit(main())
