"""Start supervised jobs on nodes (over the open SSH connection, or locally) and collect them.

A job never outlives its time limit, nor the channel: closing it makes the node's supervisor
kill the job's whole process group. So an interrupted preflight leaves nothing behind."""

from __future__ import annotations

import base64
import json
import shlex
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import supervisor

SOURCE = Path(supervisor.__file__).read_text()


@dataclass
class JobResult:
    node: str
    exit: int | None = None
    signal: int | None = None
    timed_out: bool = False
    seconds: float = 0.0
    stdout: str = ""
    stderr: str = ""
    error: str | None = None        # the job could not be started or its outcome was lost

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit == 0 and not self.timed_out

    def json_lines(self, marker: str) -> list[dict]:
        return [json.loads(l[len(marker):]) for l in self.stdout.splitlines() if l.startswith(marker)]


@dataclass
class RunningJob:
    node: str
    _stop: Callable[[], None]
    _done: threading.Event = field(default_factory=threading.Event)
    _result: JobResult | None = None

    def wait(self, timeout: float | None = None) -> JobResult:
        if not self._done.wait(timeout):
            self.stop()
            self._done.wait(10)
        return self._result or JobResult(self.node, error="the job's outcome was lost")

    def stop(self) -> None:
        self._stop()


def _command(python: str, argv: list[str], env: dict, timeout: float, cwd: str | None) -> list[str]:
    spec = base64.b64encode(json.dumps({"argv": argv, "env": env, "timeout": timeout,
                                        "cwd": cwd}).encode()).decode()
    return [python, "-c", SOURCE, spec]


def _finish(job: RunningJob, stdout: str, stderr: str, error: str | None = None) -> None:
    outcome = {}
    for line in stdout.splitlines():
        if line.startswith(supervisor.MARKER):
            outcome = json.loads(line[len(supervisor.MARKER):])
    if not outcome and error is None:
        error = "the node's supervisor reported no outcome" + (f": {stderr.strip().splitlines()[-1]}" if stderr.strip() else "")
    job._result = JobResult(job.node, outcome.get("exit"), outcome.get("signal"), bool(outcome.get("timed_out")),
                            float(outcome.get("seconds", 0.0)), stdout, stderr, error)
    job._done.set()


def start_ssh(connection, node: str, python: str, argv: list[str], *, env: dict | None = None,
              timeout: float = 60, cwd: str | None = None,
              on_line: Callable[[str], None] | None = None) -> RunningJob:
    command = " ".join(shlex.quote(a) for a in _command(python, argv, env or {}, timeout, cwd))
    channel = connection.client.get_transport().open_session()
    channel.exec_command(command)
    job = RunningJob(node, lambda: channel.shutdown_write())

    def pump() -> None:
        out, err, partial = bytearray(), bytearray(), b""
        deadline = time.monotonic() + timeout + 30
        try:
            while time.monotonic() < deadline:
                if channel.recv_ready():
                    chunk = channel.recv(65536)
                    out += chunk
                    if on_line:
                        partial += chunk
                        *lines, partial = partial.split(b"\n")
                        for line in lines:
                            on_line(line.decode(errors="replace"))
                    continue
                if channel.recv_stderr_ready():
                    err += channel.recv_stderr(65536)
                    continue
                if channel.exit_status_ready():
                    break
                channel.status_event.wait(0.02)
            error = None if channel.exit_status_ready() else "no answer from the node in time"
        except Exception as exc:   # a dropped connection is this node's error, not a crash
            error = f"the connection dropped: {exc}"
        finally:
            channel.close()
        _finish(job, out.decode(errors="replace"), err.decode(errors="replace"), error)

    threading.Thread(target=pump, daemon=True).start()
    return job


def start_local(node: str, python: str, argv: list[str], *, env: dict | None = None,
                timeout: float = 60, cwd: str | None = None,
                on_line: Callable[[str], None] | None = None) -> RunningJob:
    # Its own session: Ctrl-C on the operator's terminal must not kill the supervisor before it
    # kills the job's group; our exit closes its stdin, and that stops the job.
    proc = subprocess.Popen(_command(python, argv, env or {}, timeout, cwd), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    job = RunningJob(node, lambda: proc.stdin.close() if not proc.stdin.closed else None)
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)
    reader.start()

    def pump() -> None:
        out = []
        for line in proc.stdout:
            out.append(line)
            if on_line:
                on_line(line.rstrip("\n"))
        proc.wait()
        reader.join()
        _finish(job, "".join(out), "".join(err))

    threading.Thread(target=pump, daemon=True).start()
    return job
