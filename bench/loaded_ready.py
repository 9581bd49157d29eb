"""Preflight of a clean 3-node lab under heavy load: READY, or the load named with its figure.

Starts HOGS busy processes (niced: the machine stays usable), waits for the load to rise, runs a
full preflight (2 ranks a node), prints its seconds, the load before and after, and every result
that is not a pass or a skip; then stops the processes it started, by PID, and takes the lab down.
Root (the lab). A one-off verification, not a test: it loads the whole machine for minutes.

    sudo .venv/bin/python bench/loaded_ready.py [HOGS]"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ddp_preflight.lab import Lab  # noqa: E402


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def main() -> int:
    hogs_wanted = int(sys.argv[1]) if len(sys.argv) > 1 else 150
    name = "benchload"
    lab, _ = Lab.up(name, nodes=3)
    hogs: list[subprocess.Popen] = []
    try:
        hogs = [subprocess.Popen(["nice", "-n", "19", "sh", "-c", "while :; do :; done"]) for _ in range(hogs_wanted)]
        time.sleep(10)
        print(f"load before: {loadavg()}", flush=True)
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "ddp_preflight", "master", "worker1", "worker2", "--json",
                               "--ssh-config", str(lab.ssh_config), "--nproc-per-node", "2"],
                              capture_output=True, text=True, timeout=1200, cwd=ROOT)
        print(f"preflight: {time.monotonic() - started:.0f} s, exit {done.returncode}; load after: {loadavg()}")
        report = json.loads(done.stdout)
        for r in report["results"]:
            if r["status"] not in ("pass", "skip"):
                print(f"  {r['check']} {r['node']} {r['status']}: {r['summary']} | fix: {r['fix']}")
        counts = {s: sum(r["status"] == s for r in report["results"]) for s in ("pass", "warn", "fail", "error", "skip")}
        print(f"ok: {report['ok']} {counts}")
        return 0 if report["ok"] else 1
    finally:
        for hog in hogs:
            os.kill(hog.pid, signal.SIGTERM)
        for hog in hogs:
            hog.wait()
        Lab.down(name)


if __name__ == "__main__":
    sys.exit(main())
