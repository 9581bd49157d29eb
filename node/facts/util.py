"""Small helpers shared by the collectors."""

from __future__ import annotations

import os
import subprocess


def read(path: str, default: str | None = None) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return default


def command(argv: list[str], timeout: float = 10) -> subprocess.CompletedProcess | None:
    """Run a command without a shell; None when it is not installed."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "LC_ALL": "C"})
    except (FileNotFoundError, PermissionError):
        return None
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"timed out after {timeout} s")


def cmdline(pid: int) -> list[str]:
    raw = read_bytes(f"/proc/{pid}/cmdline")
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a] if raw else []


def read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def proc_stat(pid: int) -> dict | None:
    """ppid and start time (seconds since boot) from /proc/PID/stat."""
    raw = read_bytes(f"/proc/{pid}/stat")
    if not raw:
        return None
    fields = raw[raw.rindex(b")") + 2:].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return {"state": fields[0].decode(), "ppid": int(fields[1]), "start": int(fields[19]) / ticks}


def uptime() -> float:
    text = read("/proc/uptime", "0 0")
    return float(text.split()[0])
