"""The watcher's line to each node's agent: a process over the node's SSH connection (no extra
open ports: JSON lines over the SSH channel), or a local subprocess for this machine."""

from __future__ import annotations

import base64
import json
import shlex
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from preflight import redact

from . import agent

# The agent redacts the environments it reads with the shared rules: they go first, self-contained.
SOURCE = Path(redact.__file__).read_text() + "\n" + Path(agent.__file__).read_text()

OnMessage = Callable[[str, dict], None]       # (node, message)
OnClosed = Callable[[str, str | None], None]  # (node, why or None for a clean end)


def agent_argv(python: str, spec: dict) -> list[str]:
    return [python, "-c", SOURCE, base64.b64encode(json.dumps(spec).encode()).decode()]


class AgentLink:
    """One node's agent. Lines it prints become messages; `send` writes a command to it;
    `close` ends its stdin, and the agent exits."""

    def __init__(self, node: str, on_message: OnMessage, on_closed: OnClosed):
        self.node, self.on_message, self.on_closed = node, on_message, on_closed
        self._write: Callable[[bytes], None] | None = None
        self._closer: Callable[[], None] | None = None
        self._lock = threading.Lock()

    def send(self, command: dict) -> bool:
        with self._lock:
            if self._write is None:
                return False
            try:
                self._write((json.dumps(command) + "\n").encode())
                return True
            except (OSError, EOFError, ValueError):
                return False

    def close(self) -> None:
        with self._lock:
            closer, self._write = self._closer, None
        if closer:
            try:
                closer()
            except Exception:
                pass

    def _lines(self, chunks, last_words=lambda: None) -> None:
        """Feed messages from an iterator of byte chunks; report how it ended."""
        partial, why = b"", None
        try:
            for chunk in chunks:
                partial += chunk
                *lines, partial = partial.split(b"\n")
                for line in lines:
                    if line.strip():
                        try:
                            message = json.loads(line)
                        except ValueError:
                            continue
                        self.on_message(self.node, message)
        except Exception as exc:          # a dropped connection is this node's news, not a crash
            why = f"the connection dropped: {exc}"
        self.on_closed(self.node, why or last_words())

    def start_ssh(self, connection, python: str, spec: dict) -> None:
        command = " ".join(shlex.quote(a) for a in agent_argv(python, spec))
        channel = connection.client.get_transport().open_session()
        channel.exec_command(command)
        self._write, self._closer = channel.sendall, channel.close
        errors: list[bytes] = []

        def chunks():
            while True:
                data = channel.recv(65536)
                if not data:
                    break
                yield data

        def last_words() -> str | None:
            """The agent's last stderr line: why it ended, if it crashed."""
            lines = b"".join(errors).decode(errors="replace").strip().splitlines()
            return lines[-1] if lines else None

        def pump():
            self._lines(chunks(), last_words)

        def drain_stderr():
            # Read, so the channel's window never fills; keep the tail for last_words.
            while True:
                data = channel.recv_stderr(65536)
                if not data:
                    break
                errors.append(data)
                if sum(map(len, errors)) > 65536:
                    del errors[0]

        threading.Thread(target=drain_stderr, daemon=True).start()
        threading.Thread(target=pump, daemon=True).start()

    def start_local(self, python: str, spec: dict) -> None:
        proc = subprocess.Popen(agent_argv(python, spec), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL)

        def write(data: bytes) -> None:
            proc.stdin.write(data)
            proc.stdin.flush()

        def close() -> None:
            proc.stdin.close()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()

        self._write, self._closer = write, close
        self.process = proc
        threading.Thread(target=lambda: self._lines(iter(lambda: proc.stdout.read1(65536), b"")),
                         daemon=True).start()
