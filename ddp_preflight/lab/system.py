"""Thin, typed wrappers over the commands and /proc files the lab uses."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence

from ddp_preflight.node import proc

from .errors import LabError


def run(argv: Sequence[str], *, input: str | None = None, check: bool = True,
        timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run a command without a shell; on failure raise LabError with its last stderr line."""
    try:
        done = subprocess.run(list(argv), input=input, capture_output=True, text=True,
                              timeout=timeout)
    except FileNotFoundError:
        raise LabError(f"command not found: {argv[0]}") from None
    except subprocess.TimeoutExpired:
        raise LabError(f"{' '.join(argv[:4])} did not finish within {timeout:.0f} s") from None
    if check and done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        reason = lines[-1] if lines else f"exit code {done.returncode}"
        raise LabError(f"{' '.join(argv[:6])} failed: {reason}")
    return done


def ip_batch(commands: Iterable[str], *, netns: str | None = None, check: bool = True) -> None:
    """Run many `ip` commands in one process (`ip -batch`): one fork instead of dozens."""
    text = "\n".join(commands) + "\n"
    argv = ["ip"] + (["-n", netns] if netns else []) + ["-force", "-batch", "-"]
    run(argv, input=text, check=check)


def netns_inode(name: str) -> int | None:
    try:
        return os.stat(f"/run/netns/{name}").st_ino
    except FileNotFoundError:
        return None


def process_start_ticks(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot: with the PID, it names one process."""
    found = proc.stat(pid)
    return None if found is None else found.start_ticks


def is_same_process(pid: int, start_ticks: int) -> bool:
    return process_start_ticks(pid) == start_ticks


def pids_in_netns(inode: int) -> list[int]:
    """Every process whose network namespace is the one with this inode."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}/ns/net").st_ino == inode:
                found.append(int(entry))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found


def terminate(pids: Sequence[int], *, grace: float = 3.0) -> list[int]:
    """SIGTERM the processes, SIGKILL the ones still there after `grace` seconds.

    Returns the PIDs that had to be killed."""
    alive = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
            alive.append(pid)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if _exists(pid)]
        if alive:
            time.sleep(0.05)
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return alive


def _exists(pid: int) -> bool:
    found = proc.stat(pid)
    if found is None:
        return False
    if found.state == "Z":
        # A zombie is gone for our purpose; reap it if it is our child.
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        return False
    return True
