"""The master's line to a long-lived node program (the supervisor, hangwatch's agent): the rest of
stdin after the payload. An empty line is a heartbeat (the master sends one every HEARTBEAT
seconds); any other line is a JSON command.

EOF means the master closed the line: a stop. Silence longer than the lease means the master is
gone (killed, or the link is down, where no EOF can arrive): the program ends what it started
either way, so nothing outlives its master by more than the lease."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any, Callable, Optional

HEARTBEAT = 1.0           # seconds between the master's heartbeats
MAX_COMMAND = 1 << 20     # bytes: a longer line is not ours and is dropped


class Control:
    def __init__(self, lease: Optional[float], on_gone: Callable[[str], None],
                 on_command: Optional[Callable[[dict], None]] = None, stream=None):
        # The same buffered reader boot.py read the payload through: what it holds is ours.
        self.lease, self.on_gone, self.on_command = lease, on_gone, on_command
        self.stream: Any = stream if stream is not None else sys.stdin.buffer
        self.last = time.monotonic()
        self.why: Optional[str] = None
        self.gone = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> "Control":
        threading.Thread(target=self._read, name="control", daemon=True).start()
        if self.lease:
            threading.Thread(target=self._watch, name="lease", daemon=True).start()
        return self

    def _read(self) -> None:
        partial = b""
        while True:
            try:
                data = self.stream.read1(65536)
            except (OSError, ValueError):
                data = b""
            if not data:
                self._gone("eof")
                return
            self.last = time.monotonic()
            partial += data
            if len(partial) > MAX_COMMAND and b"\n" not in partial:
                partial = b""
            *lines, partial = partial.split(b"\n")
            for raw in lines:
                if raw.strip() and self.on_command is not None:
                    try:
                        command = json.loads(raw)
                    except ValueError:
                        continue
                    if isinstance(command, dict):
                        self.on_command(command)

    def _watch(self) -> None:
        assert self.lease
        while not self.gone.wait(min(1.0, self.lease / 4)):
            if time.monotonic() - self.last > self.lease:
                self._gone("silent")

    def _gone(self, why: str) -> None:
        with self._lock:
            if self.why is not None:
                return
            self.why = why
        self.gone.set()
        self.on_gone(why)
