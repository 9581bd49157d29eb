"""Opt in to hangwatch's Flight Recorder fetch with one line in the training script, before
init_process_group:

    import hangwatch.flight      # or copy this file next to the script: it needs only torch

torch records every collective in its Flight Recorder (Gloo too, in torch 2.13) when
TORCH_FR_BUFFER_SIZE is set, but nothing dumps it when a Gloo collective hangs. This sets the
variable (unless set) and starts a daemon thread that answers hangwatch: when the agent drops
/tmp/hangwatch-fr/PID.request, it writes the entries to /tmp/hangwatch-fr/PID.json. A thread
works where a signal would not: a rank blocked in a collective never returns to Python's main
loop, but the wait releases the GIL. Costs nothing until asked (a stat() twice a second)."""

import atexit
import json
import os
import threading
import time

FOLDER = "/tmp/hangwatch-fr"
BUFFER = "2000"          # collectives kept per rank


def _paths(pid: int) -> tuple[str, str, str]:
    base = os.path.join(FOLDER, str(pid))
    return base + ".ready", base + ".request", base + ".json"


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
        with open(partial, "w") as f:
            f.write(text)
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
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", BUFFER)
    os.makedirs(FOLDER, mode=0o1777, exist_ok=True)
    ready, _, _ = _paths(os.getpid())
    with open(ready, "w") as f:
        f.write(str(time.time()))
    atexit.register(_forget, ready)
    threading.Thread(target=_serve, name="hangwatch-flight", daemon=True).start()


enable()
