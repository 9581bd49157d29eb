"""Run the collector program on one node: over SSH with fabric, or locally."""

from __future__ import annotations

import codecs
import io
import json
import shlex
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..facts.main import MARKER, PROGRESS
from .bundle import program
from .errors import NodeError, explain_connect, explain_python

Progress = Callable[[str, list], None]     # (node, [done_bytes, total_bytes, done_files, total_files])
CONNECT_TIMEOUT = 8
COMMAND_TIMEOUT = 600


def parse_output(node: str, python: str, code: int, stdout: str, stderr: str) -> dict:
    for line in stdout.splitlines():
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):])
    raise explain_python(node, python, code, stderr)


class _ProgressStream(io.TextIOBase):
    """stderr of the collector: progress lines go to the callback, the rest is kept."""

    def __init__(self, node: str, on_progress: Progress | None):
        self.node, self.on_progress, self.kept, self._partial = node, on_progress, [], ""

    def write(self, text: str) -> int:
        self._partial += text
        *lines, self._partial = self._partial.split("\n")
        for line in lines:
            if line.startswith(PROGRESS):
                if self.on_progress:
                    self.on_progress(self.node, json.loads(line[len(PROGRESS):]))
            else:
                self.kept.append(line)
        return len(text)

    def text(self) -> str:
        return "\n".join(self.kept + [self._partial])


def _exec_with_stdin(connection, command: str, data: bytes, err: _ProgressStream,
                     timeout: float) -> tuple[int, str]:
    """Run `command` with `data` on its stdin, straight on a paramiko channel: fabric's
    in_stream feeds stdin a byte at a time, which turns 60 KB into minutes."""
    channel = connection.client.get_transport().open_session()
    try:
        channel.settimeout(1.0)
        channel.exec_command(command)
        channel.sendall(data)
        channel.shutdown_write()
        out, deadline = bytearray(), time.monotonic() + timeout
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while True:
            while channel.recv_stderr_ready():
                err.write(decoder.decode(channel.recv_stderr(65536)))
            if channel.recv_ready():
                out += channel.recv(65536)
                continue
            if channel.exit_status_ready() and not channel.recv_ready() and not channel.recv_stderr_ready():
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"no result within {timeout:.0f} s")
            channel.status_event.wait(0.02)
        return channel.recv_exit_status(), out.decode(errors="replace")
    finally:
        channel.close()


@dataclass
class SshNode:
    """One node over SSH; the connection is opened once and reused for every phase."""
    name: str
    python: str
    ssh_config: str | None = None
    connection: object = None

    def connect(self) -> None:
        from fabric import Config, Connection

        config = Config(runtime_ssh_path=self.ssh_config) if self.ssh_config else Config()
        conn = Connection(self.name, config=config, connect_timeout=CONNECT_TIMEOUT)
        try:
            conn.open()
        except Exception as exc:   # every connect failure becomes one line with a fix
            raise explain_connect(self.name, exc) from None
        self.connection = conn

    @property
    def address(self) -> str:
        """The address this node is reached at (HostName from the ssh config)."""
        if self.connection is not None:
            return self.connection.host
        return self.name

    def collect(self, request: dict, on_progress: Progress | None = None) -> dict:
        if self.connection is None:
            self.connect()
        err = _ProgressStream(self.name, on_progress)
        try:
            code, stdout = _exec_with_stdin(self.connection, f"{shlex.quote(self.python)} -",
                                            program(request).encode(), err, COMMAND_TIMEOUT)
        except Exception as exc:
            raise NodeError(f"{self.name}: the collector did not finish: {exc}",
                            f"try: ssh {self.name} {self.python} -c 'import torch'") from None
        return parse_output(self.name, self.python, code, stdout, err.text())

    def clock_offset(self, samples: int = 3) -> dict:
        """This node's clock minus ours, from the sample with the shortest round trip."""
        best = None
        for _ in range(samples):
            sent = time.time()
            done = self.connection.run("date +%s.%N", hide=True, warn=True, in_stream=False)
            got = time.time()
            try:
                remote = float(done.stdout.strip())
            except ValueError:
                return {"error": "date +%s.%N gave no time"}
            sample = {"offset": remote - (sent + got) / 2, "uncertainty": (got - sent) / 2}
            if best is None or sample["uncertainty"] < best["uncertainty"]:
                best = sample
        return best

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()


@dataclass
class LocalNode:
    """This machine, with no SSH: the same program through a subprocess."""
    name: str
    python: str

    address = "127.0.0.1"

    def connect(self) -> None:
        pass

    def collect(self, request: dict, on_progress: Progress | None = None) -> dict:
        try:
            proc = subprocess.Popen([self.python, "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        except FileNotFoundError:
            raise explain_python(self.name, self.python, 127, "No such file") from None
        except PermissionError:
            raise explain_python(self.name, self.python, 126, "") from None
        err = _ProgressStream(self.name, on_progress)
        proc.stdin.write(program(request))
        proc.stdin.close()
        stdout: list[str] = []
        # stdout can outgrow a pipe's buffer (a large shard manifest): drain it alongside.
        reader = threading.Thread(target=lambda: stdout.append(proc.stdout.read()), daemon=True)
        reader.start()
        for line in proc.stderr:
            err.write(line)
        reader.join()
        code = proc.wait()
        return parse_output(self.name, self.python, code, "".join(stdout), err.text())

    def clock_offset(self, samples: int = 3) -> dict:
        return {"offset": 0.0, "uncertainty": 0.0}

    def close(self) -> None:
        pass
