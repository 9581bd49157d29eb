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

CLOCK = "DDP_PREFLIGHT_CLOCK "
from .bundle import program
from .errors import NodeError, explain_connect, explain_python, python_argv

Progress = Callable[[str, list], None]     # (node, [done_bytes, total_bytes, done_files, total_files])
CONNECT_TIMEOUT = 8
COMMAND_TIMEOUT = 600


def parse_output(node: str, python: str, code: int, stdout: str, err: _ProgressStream) -> dict:
    for line in stdout.splitlines():
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):])
    # The program's first line is its clock sample: without it, `python` never ran it.
    raise explain_python(node, python, code, err.text(), ran=err.clock is not None)


class _ProgressStream(io.TextIOBase):
    """stderr of the collector: progress lines go to the callback, the rest is kept."""

    def __init__(self, node: str, on_progress: Progress | None):
        self.node, self.on_progress, self.kept, self._partial = node, on_progress, [], ""
        self.sent_at: float | None = None          # when the program was sent, our clock
        self.clock: tuple[float, float] | None = None   # (node's time, when it reached us)

    def write(self, text: str) -> int:
        self._partial += text
        *lines, self._partial = self._partial.split("\n")
        for line in lines:
            if line.startswith(CLOCK):
                self.clock = (float(line[len(CLOCK):]), time.time())
            elif line.startswith(PROGRESS):
                if self.on_progress:
                    self.on_progress(self.node, json.loads(line[len(PROGRESS):]))
            else:
                self.kept.append(line)
        return len(text)

    def text(self) -> str:
        return "\n".join(self.kept + [self._partial])

    def clock_offset(self) -> dict:
        """The node's clock minus ours; the round trip bounds the error."""
        if self.clock is None or self.sent_at is None:
            return {"error": "the collector sent no clock sample"}
        remote, arrived = self.clock
        return {"offset": remote - (self.sent_at + arrived) / 2, "uncertainty": (arrived - self.sent_at) / 2}


def _exec(connection, command: str, data: bytes = b"", err: _ProgressStream | None = None,
          timeout: float = 30) -> tuple[int, str]:
    """Run `command` with `data` on its stdin, straight on a paramiko channel. Fabric's run()
    feeds stdin a byte at a time (60 KB takes minutes) and costs ~0.2 s per call besides."""
    channel = connection.client.get_transport().open_session()
    try:
        if err is not None:
            err.sent_at = time.time()
        channel.settimeout(1.0)
        channel.exec_command(command)
        channel.sendall(data)
        channel.shutdown_write()
        out, deadline = bytearray(), time.monotonic() + timeout
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while True:
            while channel.recv_stderr_ready():
                chunk = channel.recv_stderr(65536)
                if err is not None:
                    err.write(decoder.decode(chunk))
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


def _check_host_keys(conn) -> None:
    """Verify host keys the way OpenSSH would (fabric accepts any key by default): the known
    hosts files of the ssh config, and an unknown host is refused unless the config says
    StrictHostKeyChecking no or accept-new."""
    import os

    import paramiko

    files = (conn.ssh_config.get("userknownhostsfile") or "~/.ssh/known_hosts ~/.ssh/known_hosts2").split()
    for name in files:
        path = os.path.expanduser(name)
        if os.path.isfile(path):
            conn.client.load_host_keys(path)
    strict = str(conn.ssh_config.get("stricthostkeychecking", "ask")).lower()
    conn.client.set_missing_host_key_policy(
        paramiko.WarningPolicy() if strict in ("no", "off", "accept-new") else paramiko.RejectPolicy())


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
        _check_host_keys(conn)
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
            code, stdout = _exec(self.connection, shlex.join(python_argv(self.python)),
                                 program(request).encode(), err, COMMAND_TIMEOUT)
        except Exception as exc:
            raise NodeError(f"{self.name}: the collector did not finish: {exc}",
                            f"try: ssh {self.name} {self.python} -c 'import torch'") from None
        facts = parse_output(self.name, self.python, code, stdout, err)
        facts["clock"] = err.clock_offset()
        return facts

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
        proc = subprocess.Popen(python_argv(self.python), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        err = _ProgressStream(self.name, on_progress)
        try:
            proc.stdin.write(program(request))
            proc.stdin.close()
        except BrokenPipeError:     # it exited without reading the program: what it said tells why
            pass
        stdout: list[str] = []
        # stdout can outgrow a pipe's buffer (a large shard manifest): drain it alongside.
        reader = threading.Thread(target=lambda: stdout.append(proc.stdout.read()), daemon=True)
        reader.start()
        for line in proc.stderr:
            err.write(line)
        reader.join()
        code = proc.wait()
        facts = parse_output(self.name, self.python, code, "".join(stdout), err)
        facts["clock"] = {"offset": 0.0, "uncertainty": 0.0}   # this machine is the reference
        return facts

    def close(self) -> None:
        pass
