"""py-spy on a node: found once, here (the agent, the ptrace facts and the master's own copy
alike), and run only when no other user can have placed or changed it, wherever it was found; a
rank's stack as py-spy's JSON."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Optional, Tuple

from . import proc
from .loader_env import tool_env
from .trust import walk

# Python frames that stop at a call into C++ that can hide a wait (backward, where DDP's reducer
# waits for its gradient all_reduce): native frames are worth their ~0.5 s there.
OPAQUE = ("torch/autograd/", "torch/_ops.py", "torch/_tensor.py")
DUMP_TIMEOUT = 10.0


def candidates() -> list:
    """Where the training environment's own py-spy would be, in order: beside its Python, on the
    PATH (absolute folders only: an empty entry is the current folder), in this user's
    ~/.local/bin (its home from the password database; HOME's too where it differs, as sudo may
    keep another user's: looked at, and refused there like anything another user owns)."""
    import pwd

    folders = [os.path.dirname(sys.executable)]
    folders += [d for d in os.environ.get("PATH", os.defpath).split(os.pathsep) if d[:1] == "/"]
    try:
        folders.append(os.path.join(pwd.getpwuid(os.geteuid()).pw_dir, ".local", "bin"))
    except KeyError:
        pass
    folders.append(os.path.expanduser(os.path.join("~", ".local", "bin")))
    return list(dict.fromkeys(os.path.join(folder, "py-spy") for folder in folders))


def find(given: Optional[str] = None) -> Tuple[Optional[str], Optional[str]]:
    """(the py-spy to run, why others were refused or None). The one given (the watcher's, or
    brought here for this watch) comes first, then the training environment's (candidates());
    whichever it is, one is run only if no other user can have placed or changed it or a folder
    above it (trust.walk), and by its resolved path (a link swapped later changes nothing)."""
    refused, seen = [], set()
    for at, path in enumerate(([given] if given else []) + candidates()):
        which = "the py-spy it was given" if given and at == 0 else f"the py-spy at {path}"
        if not os.path.isfile(path) or not os.access(path, os.X_OK):
            if given and at == 0 and os.path.lexists(path):
                refused.append(f"{which}: {path} is not an executable file")
            continue
        real = os.path.realpath(path)
        if real in seen:
            continue
        seen.add(real)
        why = walk(path)
        if why is None:
            return real, "; ".join(refused) or None
        refused.append(f"{which}: {why.sentence()}")
    return None, "; ".join(refused) or None


def dump(py_spy: str, pid: int, native) -> object:
    """One process's stack as py-spy's JSON, or {"error": why}. native: True, False or "auto"
    (native frames only when the Python stack stops where C++ can hide a wait: OPAQUE). A stall's
    stacks are taken in two parts by the agent (node/agent.py): Python frames, then native ones
    where the Python stack does not stop in torch.distributed (in_distributed)."""
    argv = [py_spy, "dump", "--pid", str(pid), "--json"] + (["--native"] if native is True else [])
    traced_by = proc.tracer(pid)
    if stopped(pid) or traced_by:
        # py-spy cannot suspend a process the kernel holds ("Failed to suspend process"), nor one
        # another tracer holds (a process has one ptrace tracer: gdb, strace, a py-spy record; its
        # attach fails with EPERM). Read it as it is, without suspending it: stopped, its memory
        # does not change under the read; traced and running, the read may catch it mid-call.
        argv.append("--nonblocking")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=DUMP_TIMEOUT, env=tool_env())
    except subprocess.TimeoutExpired:
        return {"error": f"py-spy took over {DUMP_TIMEOUT:.0f} s"}
    if done.returncode == 0:
        try:
            stack = json.loads(done.stdout)
        except ValueError:
            return {"error": "py-spy printed no JSON"}
        if native == "auto" and opaque(stack):
            deeper = dump(py_spy, pid, True)
            return stack if isinstance(deeper, dict) else deeper
        return stack
    text = (done.stderr or done.stdout).strip()
    if not os.path.exists(f"/proc/{pid}"):
        return {"error": "the process exited"}
    if re.search(r"Permission denied|Operation not permitted|EPERM", text, re.IGNORECASE):
        traced_by = traced_by or proc.tracer(pid)      # a tracer that came during the read: its EPERM
        if traced_by:
            # Not a missing permission: another tracer holds it (ptrace_scope changes nothing).
            name = (proc.read(f"/proc/{traced_by}/comm") or "").strip()[:32]
            return {"error": f"traced by pid {traced_by}" + (f" ({name})" if name else ""),
                    "traced_by": traced_by, "tracer": name or None}
        return {"error": "ptrace not permitted", "permission": True}
    lines = [line for line in text.splitlines() if line.strip() and not re.match(r"\s*\d+: ", line)]
    return {"error": lines[0][:200] if lines else f"py-spy exit {done.returncode}"}


def stopped(pid: int) -> bool:
    """Held by the kernel: SIGSTOP (state T) or a tracer (t)."""
    st = proc.stat(pid)
    return st is not None and st.state in ("T", "t")


def main_thread(stack):
    """The main thread of `py-spy dump --json`: the one whose OS thread id is the process's pid
    (a script may rename it: threading.current_thread().name = "x"); by its name where py-spy
    gave no ids; else the first. None for an empty dump."""
    threads = [t for t in stack if isinstance(t, dict)] if isinstance(stack, list) else []
    by_id = next((t for t in threads if t.get("pid") is not None and t.get("os_thread_id") == t.get("pid")), None)
    by_name = next((t for t in threads if t.get("thread_name") == "MainThread"), None)
    return by_id or by_name or (threads[0] if threads else None)


def _innermost(stack) -> str:
    main = main_thread(stack)
    frames = (main or {}).get("frames") or []
    return (frames[0].get("short_filename") or "") if frames else ""


def opaque(stack) -> bool:
    return _innermost(stack).startswith(OPAQUE)


def in_distributed(stack) -> bool:
    return _innermost(stack).startswith("torch/distributed/")
