"""Runs ON a node (standard library only): start a job in its own process group, and make
sure nothing of it outlives its time limit or the SSH channel that started it.

argv[1] is base64 JSON: {"argv": [...], "env": {...}, "timeout": seconds, "cwd": path|null}.
The job's stdout and stderr pass through. The last stdout line is the outcome:
DDP_PREFLIGHT_JOB {"exit": code or null, "signal": n or null, "timed_out": bool, "seconds": s}"""

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time

MARKER = "DDP_PREFLIGHT_JOB "


def _kill_group(pid: int) -> None:
    for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


def main() -> None:
    spec = json.loads(base64.b64decode(sys.argv[1]))
    started = time.monotonic()
    job = subprocess.Popen(spec["argv"], env={**os.environ, **spec.get("env", {})},
                           cwd=spec.get("cwd") or None, start_new_session=True,
                           stdin=subprocess.DEVNULL)
    # The operator keeps our stdin open while it waits; EOF means it is gone: stop the job.
    # Raw reads on fd 0: a daemon thread inside the buffered reader aborts interpreter exit.
    def watch_stdin():
        while os.read(0, 4096):
            pass
        _kill_group(job.pid)
    threading.Thread(target=watch_stdin, daemon=True).start()
    timed_out = False
    try:
        job.wait(timeout=float(spec.get("timeout", 60)))
    except subprocess.TimeoutExpired:
        timed_out = True
    _kill_group(job.pid)     # the job's own children too, even after a clean exit
    code = job.wait()
    outcome = {"exit": code if code >= 0 else None, "signal": -code if code < 0 else None,
               "timed_out": timed_out, "seconds": round(time.monotonic() - started, 3)}
    sys.stdout.flush()
    sys.stdout.write("\n" + MARKER + json.dumps(outcome) + "\n")
    sys.stdout.flush()
    os._exit(0)     # do not wait for the stdin watcher


if __name__ == "__main__":
    main()
