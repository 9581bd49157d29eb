"""Opt in to hangwatch's Flight Recorder fetch, for a run that ddp-preflight did not launch (one
started by hand with torchrun, then watched with `hangwatch attach`): one line in the training
script, before init_process_group:

    import ddp_preflight.hangwatch.flight      # ddp-preflight installed in the training environment

Under `ddp-preflight --launch` it is not needed: every rank answers already (node/rank_bootstrap.py),
and this import does nothing there.

It sets TORCH_FR_BUFFER_SIZE (unless set: torch before 2.13 records nothing without it) and starts
the thread of node/rank_bootstrap.py, which answers the agent in this user's folder
/tmp/hangwatch-fr-UID, where the rank also records how its script ended (PID.end: an uncaught
exception, or its end), for the agent to read when it exits. The folder is private (0700, this
user's, never a symlink): another user who made that name first could otherwise point this rank's
writes at a file of theirs. If the name is
taken, the Flight Recorder fetch stays off and one line on stderr says how to free it."""

from __future__ import annotations

import atexit
import os
import sys

from ddp_preflight.node.flight import BUFFER, folder_of
from ddp_preflight.node.private import own_private_folder
from ddp_preflight.node.rank_bootstrap import FOLDER_VARIABLE, exit_code, record_ending, start_answering

FOLDER = folder_of(os.geteuid())      # hangwatch's agent finds it by the rank's uid


def enable() -> None:
    if os.environ.get(FOLDER_VARIABLE):
        return                   # launched by ddp-preflight: this rank answers in its run's folder
    refused = own_private_folder(FOLDER, os.geteuid())
    if refused:
        sys.stderr.write(f"ddp_preflight.hangwatch.flight: the Flight Recorder fetch is off: {refused}; another user "
                         f"may have made it first. Fix: remove it (`sudo rm -rf {FOLDER}`) and restart\n")
        return
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", BUFFER)
    start_answering(FOLDER)
    record_how_it_ends(FOLDER)


def record_how_it_ends(folder: str) -> None:
    """PID.end for the agent (node/rank_bootstrap.py's record): an uncaught exception as it
    reaches sys.excepthook, a sys.exit with its code as it is called, any other end ("ended": the
    script returned, or raised SystemExit itself; the process's exit code says which) as the
    interpreter starts its teardown. All come before the teardown, which is when the rank's
    connections close and its peers fail."""
    pid, previous = os.getpid(), sys.excepthook
    recorded: list[bool] = []

    def on_exception(kind, exc, tb):
        if os.getpid() == pid and not recorded:
            recorded.append(True)
            record_ending(folder, "raised", exc.with_traceback(tb))
        previous(kind, exc, tb)

    def on_exit():
        if os.getpid() == pid and not recorded:     # a forked child (a DataLoader worker): not ours
            recorded.append(True)
            record_ending(folder, "ended")

    exit_with = sys.exit

    def exit(code=None):
        # sys.exit(3) never reaches the excepthook and atexit cannot see its code: said here.
        if os.getpid() == pid and not recorded:
            recorded.append(True)
            record_ending(folder, "exit", code=exit_code(SystemExit(code)))
        exit_with(code)

    sys.excepthook = on_exception
    sys.exit = exit
    atexit.register(on_exit)


enable()
