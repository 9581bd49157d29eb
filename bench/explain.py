"""`ddp-preflight explain` on a 1 GB log folder: time and peak memory, in one run.

The folder is a launch's as ddp-preflight --launch writes it (master.log and worker1.log, 512 MiB
each), made of the real lines of a recorded run (tests/unit/artifacts/logs/raise/: each rank's
step lines, torch's warnings, torchrun's own lines) repeated, with that run's one failure (rank 1's
RuntimeError, its peers' lost peer, torchrun's tables) at the end. explain runs in a child
process (its peak RSS is its own), three times (the first reads from disk, the others from the page
cache). Goals: a 1 GB log in seconds (under 10 s per GB from the cache), in bounded memory (peak
RSS under 100 MiB more than the interpreter with the modules loaded)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "tests" / "unit" / "artifacts" / "logs" / "raise"
SIZE = 512 << 20                     # bytes per node log
ROUNDS = 3
GOAL_S_PER_GB, GOAL_RSS_MIB = 10.0, 100.0

CHILD = """
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
from ddp_preflight.explain import explain
loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
e = explain([sys.argv[2]])
seconds = time.perf_counter() - t
d = e.diagnosis
print(json.dumps({"seconds": seconds, "loaded_kib": loaded,
                  "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "kind": d.kind.value if d else None, "culprits": list(d.culprits) if d else None,
                  "reason": d.reason.value if d and d.reason else None}))
"""


def split(lines: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    """The recorded log's ordinary lines (up to its first traceback) and its failure (the rest)."""
    at = next(i for i, line in enumerate(lines) if b"Traceback" in line)
    return lines[:at], lines[at:]


def make_log(source: Path, target: Path) -> None:
    ordinary, failure = split(source.read_bytes().splitlines(keepends=True))
    steps = [f"[default{r}]:step {s} loss 0.{s % 9973:04d}\n".encode() for s in range(200) for r in (0, 1)]
    block = b"".join(ordinary + steps)
    with open(target, "wb") as f:
        written = 0
        while written < SIZE:
            f.write(block)
            written += len(block)
        f.write(b"".join(failure))


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="explain-bench-"))
    try:
        for node in ("master", "worker1"):
            make_log(RECORDED / f"{node}.log", folder / f"{node}.log")
        total = sum(p.stat().st_size for p in folder.iterdir())
        runs = []
        for _ in range(ROUNDS):
            out = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), str(folder)], capture_output=True,
                                 text=True, check=True)
            runs.append(json.loads(out.stdout))
        best = min(r["seconds"] for r in runs)
        extra_mib = max(r["peak_kib"] - r["loaded_kib"] for r in runs) / 1024
        gb = total / 1e9
        first = runs[0]
        print(f"explain on {gb:.2f} GB ({len(list(folder.iterdir()))} files): verdict {first['kind']} "
              f"culprits {first['culprits']} reason {first['reason']}")
        times = ", ".join(f"{r['seconds']:.2f}" for r in runs)
        print(f"time: {times} s; best {best / gb:.2f} s/GB "
              f"(goal {GOAL_S_PER_GB:.0f} s/GB: ratio {best / gb / GOAL_S_PER_GB:.2f}); "
              f"{total / best / 1e6:.0f} MB/s")
        print(f"peak RSS: {max(r['peak_kib'] for r in runs) / 1024:.0f} MiB, {extra_mib:.1f} MiB over the interpreter "
              f"with the modules loaded (goal {GOAL_RSS_MIB:.0f} MiB: ratio {extra_mib / GOAL_RSS_MIB:.2f})")
        print(f"load average while measured: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
              f"this process's own peak: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    finally:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
