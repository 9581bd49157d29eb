"""This machine, with no SSH: node programs as local subprocesses."""

from __future__ import annotations

import collections
import io
import subprocess
import threading
from typing import cast

from .node import Node, Process


class LocalProcess(Process):
    def __init__(self, argv: list[str]):
        # Its own session: Ctrl-C on the operator's terminal must not reach it before the master
        # has stopped it in order; the master's exit closes its stdin, and that stops it.
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
        assert self.proc.stdin and self.proc.stdout and self.proc.stderr
        # Popen's default pipes are buffered readers: read1 returns what is there.
        self._stdin = self.proc.stdin
        self._stdout = cast(io.BufferedReader, self.proc.stdout)
        self._errors = cast(io.BufferedReader, self.proc.stderr)
        self._lock = threading.Lock()
        self._stderr: collections.deque[bytes] = collections.deque(maxlen=64)
        self._stderr_done = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for chunk in iter(lambda: self._errors.read1(4096), b""):
            self._stderr.append(chunk)
        self._stderr_done.set()

    def write(self, data: bytes) -> bool:
        with self._lock:
            try:
                self._stdin.write(data)
                self._stdin.flush()
                return True
            except (OSError, ValueError):
                return False

    def heartbeat(self) -> None:
        self.write(b"\n")      # a pipe's buffer holds 64 KiB: a newline a second never blocks

    def close_input(self) -> None:
        with self._lock:
            try:
                self._stdin.close()
            except OSError:
                pass

    def read(self) -> bytes:
        return self._stdout.read1(65536)

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stderr_text(self) -> str:
        self._stderr_done.wait(5)         # once it has ended: its last words are in
        return b"".join(self._stderr).decode(errors="replace")[-8192:]

    def kill(self) -> None:
        try:
            self.proc.terminate()      # boot.py unwinds on SIGTERM: its private folder goes
        except OSError:
            pass


class LocalNode(Node):
    address = "127.0.0.1"

    @property
    def is_local(self) -> bool:
        return True

    def connect(self) -> None:
        pass

    def close(self) -> None:
        pass

    def _spawn(self, argv: list[str]) -> Process:
        return LocalProcess(argv)      # sh, which says what --python is if it cannot run

    def _clock_offset(self, sent, clock) -> dict:
        return {"offset": 0.0, "uncertainty": 0.0}     # this machine is the reference
