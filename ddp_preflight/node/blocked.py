"""What a process's main thread is blocked in, by the system call the kernel shows for it
(/proc/PID/syscall: its number and arguments, for the thread group's leader, the main thread):
asleep (time.sleep), waiting to receive on a socket (with the TCP peer, when it is one), a pipe or
a file, or on a futex (a lock). Evidence a verdict reads when a rank sits idle outside any
collective: a rank asleep in its loop, or waiting for a service that never answers, is not a rank
that left its loop. Reading the file needs the same permission as reading its memory (root, or
its own user with ptrace allowed); None when it cannot be read, or the thread is running.

Standard library only, Python 3.8+. System call numbers are per architecture: x86_64 and
aarch64 here; elsewhere nothing is said."""

from __future__ import annotations

import os
from typing import Dict, List, Optional

from . import proc

# name -> number, by machine (the kernel's unistd tables)
NUMBERS = {
    "x86_64": {"read": 0, "poll": 7, "select": 23, "nanosleep": 35, "recvfrom": 45, "recvmsg": 47,
               "futex": 202, "epoll_wait": 232, "clock_nanosleep": 230, "pselect6": 270, "ppoll": 271,
               "epoll_pwait": 281, "recvmmsg": 299, "accept": 43, "accept4": 288, "wait4": 61, "readv": 19},
    "aarch64": {"read": 63, "readv": 65, "pselect6": 72, "ppoll": 73, "nanosleep": 101, "clock_nanosleep": 115,
                "futex": 98, "epoll_pwait": 22, "recvfrom": 207, "recvmsg": 212, "recvmmsg": 243, "accept": 202,
                "accept4": 242, "wait4": 260},
}
SLEEPS = ("nanosleep", "clock_nanosleep")
RECEIVES = ("read", "readv", "recvfrom", "recvmsg", "recvmmsg")
POLLS = ("poll", "ppoll", "select", "pselect6")       # with no descriptor: a sleep (Python before 3.11: select)
ACCEPTS = ("accept", "accept4")


def _names() -> Dict[int, str]:
    return {number: name for name, number in NUMBERS.get(os.uname().machine, {}).items()}


def raw(pid: int) -> Optional[List[int]]:
    """The system call number and its six arguments; None when running, not readable or gone."""
    text = (proc.read(f"/proc/{pid}/syscall") or "").split()
    if len(text) < 7 or text[0] in ("running", "-1"):
        return None
    try:
        return [int(text[0])] + [int(a, 16) for a in text[1:7]]
    except ValueError:
        return None


def waits_in(pid: int, tables: Optional[dict] = None) -> Optional[dict]:
    """{"call": "sleep"} | {"call": "recv", "on": "tcp 10.0.0.2:5000" | "pipe" | "file PATH" |
    "socket", "fd": N} | {"call": "accept", "on": ..., "fd": N} | {"call": "lock"} | {"call": "wait-child"} |
    {"call": "poll"}; None when not blocked in one of these (or not readable). `tables`: the
    caller's TCP tables by network namespace, read at most once (as node/sockets.py's)."""
    found = raw(pid)
    if found is None:
        return None
    name = _names().get(found[0])
    if name is None:
        return None
    if name in SLEEPS or name in POLLS and found[1] == 0:
        return {"call": "sleep"}
    if name in RECEIVES or name in ACCEPTS:
        return {"call": "recv" if name in RECEIVES else "accept", "on": _descriptor(pid, found[1], tables),
                "fd": found[1]}
    if name == "futex":
        return {"call": "lock"}
    if name == "wait4":
        return {"call": "wait-child"}
    return {"call": "poll"}


def _descriptor(pid: int, fd: int, tables: Optional[dict]) -> str:
    try:
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return "?"
    if target.startswith("socket:["):
        inode = int(target[8:-1])
        tables = {} if tables is None else tables
        netns = proc.netns(pid)
        if netns not in tables:
            tables[netns] = proc.tcp_table(pid)
        mine = next((s for s in tables[netns] if s.inode == inode), None)
        if mine is None:
            return "socket"
        listening = mine.state == "0A"
        return f"tcp {mine.local} (listening)" if listening else f"tcp {mine.remote}"
    if target.startswith("pipe:["):
        return "pipe"
    if target.startswith(("anon_inode:", "/dev/")):
        return target[:80]
    return "file " + target[:200]
