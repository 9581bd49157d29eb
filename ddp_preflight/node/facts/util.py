"""Running a command on the node for the collectors (/proc is read in ddp_preflight/node/proc.py)."""

from __future__ import annotations

import os
import shutil
import subprocess

from ..loader_env import tool_env
from ..trust import walk

REFUSED = 126     # the exit code of a command not run, as a shell's for one it cannot run


def command(argv: list[str], timeout: float = 10) -> subprocess.CompletedProcess | None:
    """Run a command without a shell; None when it is not installed. It is found in the PATH's
    absolute folders only (an empty or relative entry is the caller's folder) and run by that
    path, and only when no other user can change it or a folder above it (node/trust.py): else
    exit code 126 and why, on stderr. It gets no variable that loads anything (LD_PRELOAD,
    GIT_*, ...: node/loader_env.py's tool_env), whatever the caller's environment holds."""
    folders = [d for d in os.environ.get("PATH", os.defpath).split(os.pathsep) if d[:1] == "/"]
    program = shutil.which(argv[0], path=os.pathsep.join(folders)) if "/" not in argv[0] else argv[0]
    if program is None:
        return None
    refused = walk(program)
    if refused is not None:
        return subprocess.CompletedProcess(argv, REFUSED, "", f"{argv[0]} was not run: {refused.sentence()}")
    try:
        return subprocess.run([program, *argv[1:]], capture_output=True, text=True, timeout=timeout,
                              env=tool_env(LC_ALL="C"))
    except (FileNotFoundError, PermissionError):
        return None
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"timed out after {timeout} s")
