"""Running a command on the node for the collectors (/proc is read in node/proc.py)."""

from __future__ import annotations

import os
import subprocess


def command(argv: list[str], timeout: float = 10) -> subprocess.CompletedProcess | None:
    """Run a command without a shell; None when it is not installed."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "LC_ALL": "C"})
    except (FileNotFoundError, PermissionError):
        return None
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"timed out after {timeout} s")
