"""Opt in to hangwatch's Flight Recorder fetch with one line in the training script, before
init_process_group:

    import hangwatch.flight      # ddp-preflight installed in the training environment

torch records every collective in its Flight Recorder (Gloo too, in torch 2.13) when
TORCH_FR_BUFFER_SIZE is set, but nothing dumps it when a Gloo collective hangs. This sets the
variable (unless set) and starts a daemon thread that answers hangwatch: when the agent drops
PID.request in this user's folder /tmp/hangwatch-fr-UID, it writes the entries to PID.json there.
A thread works where a signal would not: a rank blocked in a collective never returns to Python's
main loop, but the wait releases the GIL. Costs nothing until asked (a stat() twice a second).

The folder is private (0700, this user's, never a symlink): another user who made that name
first could otherwise point this rank's writes at a file of theirs. If the name is taken, the
Flight Recorder stays off and one line on stderr says how to free it."""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time

from node.flight import folder_of
from node.private import own_private_folder

FOLDER = folder_of(os.geteuid())      # hangwatch's agent finds it by the rank's uid
BUFFER = "2000"          # collectives kept per rank
# A new file, this process's own: never through a symlink, never into a file already there.
CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW


def _paths(pid: int) -> tuple[str, str, str]:
    base = os.path.join(FOLDER, str(pid))
    return base + ".ready", base + ".request", base + ".json"


def _write_new(path: str, text: str) -> None:
    try:
        os.unlink(path)          # left by an earlier process with this pid (the folder is ours alone)
    except FileNotFoundError:
        pass
    with os.fdopen(os.open(path, CREATE, 0o600), "w") as f:
        f.write(text)


def _serve() -> None:
    ready, request, answer = _paths(os.getpid())
    while True:
        time.sleep(0.5)
        if not os.path.exists(request):
            continue
        try:
            import torch._C._distributed_c10d as c10d
            text = c10d._dump_fr_trace_json(True, False)      # with stack traces, completed ones too
            text = text.decode() if isinstance(text, bytes) else text
        except Exception as exc:      # no process group yet, or an older torch: say so
            text = json.dumps({"error": f"{type(exc).__name__}: {exc}"})
        partial = answer + ".part"
        _write_new(partial, text)
        os.replace(partial, answer)
        try:
            os.unlink(request)
        except FileNotFoundError:
            pass


def _forget(ready: str) -> None:
    try:
        os.unlink(ready)
    except FileNotFoundError:
        pass


def enable() -> None:
    refused = own_private_folder(FOLDER, os.geteuid())
    if refused:
        sys.stderr.write(f"hangwatch.flight: the Flight Recorder fetch is off: {refused}; another user "
                         f"may have made it first. Fix: remove it (`sudo rm -rf {FOLDER}`) and restart\n")
        return
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", BUFFER)
    ready, _, _ = _paths(os.getpid())
    _write_new(ready, str(time.time()))
    atexit.register(_forget, ready)
    threading.Thread(target=_serve, name="hangwatch-flight", daemon=True).start()


enable()
