"""The master's line to a long-lived node program (the supervisor, hangwatch's agent): the rest of
stdin after the payload. An empty line is a heartbeat (the master sends one every HEARTBEAT
seconds); any other line is a JSON command.

EOF means the master closed the line: a stop. Silence longer than the lease means the master is
gone (killed, or the link is down, where no EOF can arrive): the program ends what it started
either way, so nothing outlives its master by more than the lease. The supervisor and the agent
end their jobs their own way; a program that only collects (facts) leads its own process group
and ends every process it started (end_started) and itself."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from . import proc

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


def lead_own_group() -> bool:
    """Make this program the leader of a process group of its own, which what it starts joins:
    end_started() then finds them all, also one whose parent has died (a stuck git's child, once
    a timeout killed the git). False where it cannot (it stays in the group it was given)."""
    if os.getpgrp() == os.getpid():
        return True
    try:
        os.setpgid(0, 0)
        return True
    except OSError:
        return False


def end_started() -> None:
    """SIGKILL every process this one started (a git, an import scan, a hung nvidia-smi, what they
    started): its descendants, and the rest of its own process group when it leads one. Twice:
    one started while the first list was taken is in the second."""
    me = os.getpid()
    own_group = os.getpgrp() == me
    for _ in range(2):
        children: Dict[int, List[int]] = {}
        grouped = []
        for pid in proc.pids():
            st = proc.stat(pid)
            if st is not None:
                children.setdefault(st.ppid, []).append(pid)
            if own_group and pid != me:
                try:
                    if os.getpgid(pid) == me:
                        grouped.append(pid)
                except OSError:
                    pass
        found, frontier = [], [me]
        while frontier:
            for child in children.get(frontier.pop(), ()):
                found.append(child)
                frontier.append(child)
        for pid in found + grouped:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass       # gone already
