"""A job in its own process group, on the node: nothing of it outlives its time bound, the
master's stop, or the master itself.

spec: {"program": "supervise", "job": <a node program's spec>, "env": {...}, "timeout": seconds,
       "lease": seconds or null, "cwd": path or null}
The job runs as a child (this package from the zip, its spec on its stdin: never in argv), with
`env` on top of the node's environment, in this program's private folder. Its stdout and stderr
are the channel's. The master's line (control.py) stops it: EOF is a stop, silence longer than
the lease means the master is gone. Then, and at the bound, and when the job ends by itself, the
whole group is ended (SIGTERM, then SIGKILL after a grace), its children too; the private folder
goes with this program (boot.py). The last line is the outcome: JOB + JobOutcome."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from . import protocol
from .control import Control

GRACE = 2.0      # seconds between SIGTERM and SIGKILL

CHILD = "import sys; sys.path.insert(0, sys.argv[1]); from node.programs import child; child()"


def kill_group(pgid: int, grace: float = GRACE) -> None:
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


def start_child(job: dict, work, env: dict, cwd=None) -> subprocess.Popen:
    """A node program as a process of its own, in a new session (its own process group)."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, work.zip_path], stdin=subprocess.PIPE,
                            env=env, cwd=cwd or None, start_new_session=True)
    try:
        proc.stdin.write(json.dumps({**job, "work": work.folder}).encode())
        proc.stdin.close()
    except OSError:
        pass       # it died at once: its exit code says so
    return proc


def main(spec: dict, work) -> int:
    started = time.monotonic()
    env = {**os.environ, **{str(k): str(v) for k, v in (spec.get("env") or {}).items()}}
    try:
        job = start_child(spec["job"], work, env, spec.get("cwd"))
    except OSError as exc:
        protocol.emit(protocol.JOB, protocol.JobOutcome(exit=127, seconds=0.0).to_json())
        sys.stderr.write(f"ddp-preflight node: cannot start the job: {exc}\n")
        return 0
    control = Control(spec.get("lease"), on_gone=lambda why: kill_group(job.pid)).start()
    timed_out = False
    try:
        job.wait(timeout=float(spec.get("timeout") or 60))
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        kill_group(job.pid)       # the job's own children too, even after a clean exit
    code = job.wait()
    stopped = {"eof": "asked", "silent": "master-silent"}.get(control.why or "")
    outcome = protocol.JobOutcome(exit=code if code >= 0 else None, signal=-code if code < 0 else None,
                                  timed_out=timed_out, stopped=stopped,
                                  seconds=round(time.monotonic() - started, 3))
    sys.stdout.flush()
    sys.stdout.write("\n")
    protocol.emit(protocol.JOB, outcome.to_json())
    return 0
