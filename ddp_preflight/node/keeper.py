"""What the agent keeps of each rank beyond its CPU, and reads when it ends: the bytes it reads
and writes, the CPU its helpers use (its descendants: DataLoader workers, compile workers), the
tail of its output when its stdout or stderr is a file, its own record of how its script ended
(node/rank_bootstrap.py's PID.end), and whether the node's OOM killer struck. Standard library only.

The agent is often root and the rank another user's: an output file is never opened by its path
(a name can be swapped for a link to a secret). It is opened through the rank's own open file
(/proc/PID/fd/N), only when that is a regular file (never a pipe, a FIFO, a socket or a terminal:
opening a pipe's read end would take the rank's output), and kept open for the rank's life."""

from __future__ import annotations

import os
import stat
from typing import Dict, List, Optional

from . import flight, proc
from .rank_bootstrap import FOLDER_VARIABLE
from .wire import Wire

TAIL_BYTES = 16 << 10     # of each output file, read at the end
TAIL_LINES = 60


class Kept:
    def __init__(self, uid: Optional[int], folder: Optional[str], outputs: List[int]):
        self.uid, self.folder, self.outputs = uid, folder, outputs
        self.io: Optional[tuple] = None                     # (monotonic, bytes) at the last sample
        # CPU seconds its descendants had used at the last sample: the live ones' own and what
        # their reaped children used, and what its own reaped children used (a helper that lived
        # and ended between two samples counts too); (monotonic, seconds, any alive then).
        self.helpers: Optional[tuple] = None


class Keeper:
    def __init__(self):
        self.kept: Dict[int, Kept] = {}
        self.ooms = proc.oom_kills()        # the node's OOM-kill count at the last sample
        self.wire = Wire()                  # the bytes on each rank's TCP connections (node/wire.py)

    def found(self, pid: int) -> None:
        env = proc.environ(pid) or {}
        uid = proc.uid(pid)
        folder = env.get(FOLDER_VARIABLE) or (flight.folder_of(uid) if uid is not None else None)
        before = self.kept.pop(pid, None)        # the pid's last process, whose end was not seen
        for fd in before.outputs if before is not None else ():
            os.close(fd)
        self.kept[pid] = Kept(uid, folder, output_files(pid))

    def sampled(self, ooms: Optional[int]) -> None:
        """The node's OOM-kill count a rank's end is compared with (the agent passes the count read
        before its ranks, when no rank was on its way out)."""
        self.ooms = ooms

    def sample(self, pid: int, now: float, stats: Dict[int, proc.Stat], children: Dict[int, List[int]],
               sampled: Optional[float] = None) -> dict:
        """This sample's io (bytes/s), wire (bytes its TCP connections carried so far) and
        children_cpu (% of a core), where known. `sampled`: when the agent's sample began, the
        same for all its ranks, so that the node's sockets are dumped once a sample, not once a
        rank (a dump walks the kernel's whole TCP hash table: 1.5 ms of CPU a family here)."""
        kept = self.kept.get(pid)
        if kept is None:
            return {}
        out = {}
        total = proc.io_bytes(pid)
        if total is not None:
            if kept.io is not None:
                out["io"] = round((total - kept.io[1]) / max(now - kept.io[0], 1e-6), 1)
            kept.io = (now, total)
        moved = self.wire.moved(pid, now if sampled is None else sampled)
        if moved is not None:
            out["wire"] = moved
        alive = [d for d in descendants(pid, children) if d in stats]
        own = stats.get(pid)
        used = (own.children_seconds if own is not None else 0.0) + \
            sum(stats[d].cpu_seconds + stats[d].children_seconds for d in alive)
        if kept.helpers is not None:
            at, before, had = kept.helpers
            if alive or had or used > before:
                # Less than before: one left the family without being waited for (reaped by the
                # kernel, or orphaned); what it used since the last sample is lost.
                out["children_cpu"] = round(100 * max(0.0, used - before) / max(now - at, 1e-6), 1)
        kept.helpers = (now, used, bool(alive))
        return out

    def ended(self, pid: int) -> dict:
        """What its end leaves: {"oom", "output", "ending"} (each only where known)."""
        kept = self.kept.pop(pid, None)
        out = {}
        ooms = proc.oom_kills()
        if ooms is not None and self.ooms is not None:
            out["oom"] = ooms > self.ooms
        if kept is None:
            return out
        lines: List[str] = []
        for fd in kept.outputs:
            lines += tail(fd)
            os.close(fd)
        if lines:
            out["output"] = lines[-TAIL_LINES:]
        if kept.folder and kept.uid is not None:
            record = flight.ending(kept.folder, kept.uid, pid)
            if record is not None:
                out["ending"] = record
        return out

    def forget(self, alive) -> None:
        """Let go of ranks no longer there (their end was seen, or not)."""
        for pid in [p for p in self.kept if p not in alive]:
            for fd in self.kept.pop(pid).outputs:
                os.close(fd)


def descendants(pid: int, children: Dict[int, List[int]]) -> List[int]:
    out: List[int] = []
    todo = list(children.get(pid, ()))
    while todo and len(out) < 10000:
        child = todo.pop()
        out.append(child)
        todo += children.get(child, ())
    return out


def children_of(stats: Dict[int, proc.Stat]) -> Dict[int, List[int]]:
    children: Dict[int, List[int]] = {}
    for pid, st in stats.items():
        children.setdefault(st.ppid, []).append(pid)
    return children


def output_files(pid: int) -> List[int]:
    """The rank's stdout and stderr, opened for reading through its own open files, when they are
    regular files (one descriptor per distinct file)."""
    fds, seen = [], set()
    for n in (1, 2):
        path = f"/proc/{pid}/fd/{n}"
        try:
            before = os.stat(path)                 # what the rank's descriptor is, without opening it
        except OSError:
            continue
        if not stat.S_ISREG(before.st_mode) or (before.st_dev, before.st_ino) in seen:
            continue
        try:
            # O_NOCTTY: should it have become a terminal since the stat, it does not become ours.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        except OSError:
            continue
        after = os.fstat(fd)
        if not stat.S_ISREG(after.st_mode) or (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
            os.close(fd)
            continue
        seen.add((after.st_dev, after.st_ino))
        fds.append(fd)
    return fds


def tail(fd: int) -> List[str]:
    """The last lines of a file, from its last TAIL_BYTES."""
    try:
        size = os.fstat(fd).st_size
        data = os.pread(fd, min(size, TAIL_BYTES), max(0, size - TAIL_BYTES))
    except OSError:
        return []
    lines = data.decode(errors="replace").splitlines()
    if size > TAIL_BYTES and lines:
        lines = lines[1:]                     # the first is cut
    return lines[-TAIL_LINES:]
