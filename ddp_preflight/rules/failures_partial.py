"""Messages as a paste leaves them (rules/failures.py joins them to its CATALOGUE, after its own):
a message cut or retyped without the part that says its cause, read for what it still says, and
with what to collect in place of a fix for a cause it does not show. Each has its own id, so that a
line wrapped in two is joined back where the whole message says more (explain/paste.py). Pure,
standard library only; every wording is in a log users pasted (tests/unit/artifacts/pasted/index.json
says where from)."""

from __future__ import annotations

from .failure_kinds import Cause, FailureKind, Message, Part, Sure, _m
from .fix import run

K, C, P = FailureKind, Cause, Part

PARTIAL: tuple[Message, ...] = (
    # init_process_group's store barrier timed out (torch < 2.0), its "(world_size=N, worker_count=M)" cut or
    # not retyped: fewer or more processes than the world, the counts alone say (rules/failures.py's store-barrier)
    _m("store-barrier-uncounted", ("store based barrier",),
       r"Timed out initializing process group in store based barrier(?![^\n]*?world_size=)",
       K.STORE_TIMEOUT, C.UNKNOWN, P.ROOT,
       "init_process_group's store barrier timed out: the processes it counted were not the world size",
       run("grep -n 'store based barrier' <every rank's log>", note="its (world_size=N, worker_count=M): fewer than "
           "the world never joined (a node not started, or not reaching the master); more: the job was launched twice"),
       Sure.LIKELY),
    # NCCL's watchdog line cut inside "collective operation timeout" or before its WorkNCCL's fields (a paste's end, a
    # wrap; corpus 362), a progress bar run into it: only
    # the watchdog prints "Watchdog caught", and only when a collective timed out (rules/failures.py's watchdog)
    _m("watchdog-cut", ("Watchdog caught",),
       r"Watchdog caught (?:collective operation timeout: (?:W\w*(?:\(\w*)?)?|collective operation t\w*|collective o\w*"
       r"|c\w*)?\s*$",
       K.TIMEOUT_UNKNOWN_ROOT, C.COLLECT_FLIGHT_RECORDER, P.TIMEOUT,
       "a collective waited past the process group's timeout (the rest of the watchdog's line is cut): some rank never "
       "entered it",
       run("export TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1   # then ddp-preflight explain the "
           "dumps (TORCH_NCCL_DEBUG_INFO_TEMP_FILE)", note="each rank's Flight Recorder says which rank never entered "
           "the collective"), Sure.UNKNOWN),
)
