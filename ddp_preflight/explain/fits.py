"""A fix that fits what the paste shows: never what it already did, and for its launcher and
backend. The catalogue's fixes are for a run nothing is known of; a paste with NCCL's INFO lines
already had NCCL_DEBUG=INFO, one with torchrun's [default0]: prefixes already had --tee, a DeepSpeed
launch has no torchrun --tee (nor has mp.spawn; accelerate launch names it its own way), a run that
shows no NCCL gets no NCCL Flight Recorder variables. Pure:
a catalogue fix (data, compared as data) to the one for this run."""

from __future__ import annotations

from dataclasses import replace
from typing import TypeVar

from ddp_preflight.rules.failures import BY_ID, ENDED_FIXES, Cause
from ddp_preflight.rules.failures_stopped import SLURM_RECORD, STOPPED_OUTSIDE
from ddp_preflight.rules.fix import Fix, change, run

from .messages import Shown

# The catalogue's fixes that turn NCCL's debug lines on, to learn what NCCL's error was
NCCL_DEBUG = {BY_ID[id].fix for id in ("nccl-error", "nccl-system-error", "nccl-result-system", "nccl-result")}
ALREADY_DEBUG = run("grep -n 'NCCL WARN' <every rank's log>",
                    note="NCCL_DEBUG=INFO was on: its WARN line before the error names the call and the interface")
# torchrun's way of keeping each rank's own output, and what DeepSpeed's launcher already prints
KEEP_OUTPUT = ENDED_FIXES[Cause.UNKNOWN]
DEEPSPEED_OUTPUT = run("grep -n -B40 'Killing subprocess' <the log>",
                       note="DeepSpeed's launcher prints its ranks' own output: the first one's error is above its lines")
TEED_OUTPUT = run("grep -n 'Traceback\\|Error' <the log>",
                  note="torchrun's --tee was on: each rank's own lines are in it, after [defaultN]:")
SPAWN_OUTPUT = run("grep -n 'Traceback\\|Error\\|terminated with' <the log>",
                   note="mp.spawn's processes print to this log: the failed one's own traceback follows mp.spawn's "
                        "'-- Process N terminated with the following error:', or is above its word on that process")
# accelerate launch takes torchrun's --tee and --log-dir as its own -t/--tee and --log_dir (accelerate's launch.py)
ACCELERATE_OUTPUT = run("accelerate launch --log_dir LOGS --tee 3 ...",
                        note="keeps each rank's own output (accelerate hands both to torchrun): it says why it exited")
# NCCL's Flight Recorder variables, where no line shows NCCL (a Gloo run, or a silent one): hangwatch's
# fetch records the Flight Recorder of any backend
FLIGHT = BY_ID["watchdog"].fix
ANY_FLIGHT = change("import ddp_preflight.hangwatch.flight   # in the training script, before init_process_group; then hangwatch "
                     "attach", note="each rank's Flight Recorder then says which rank never entered the collective")


def fit(fix: Fix | None, shown: set[Shown]) -> Fix | None:
    if fix is None:
        return None
    if fix in NCCL_DEBUG and Shown.NCCL_DEBUG_INFO in shown:
        return ALREADY_DEBUG
    if fix == KEEP_OUTPUT and Shown.DEEPSPEED in shown:
        return DEEPSPEED_OUTPUT
    if fix == KEEP_OUTPUT and Shown.TEE in shown:
        return TEED_OUTPUT
    if fix == KEEP_OUTPUT and Shown.SPAWN in shown:
        return SPAWN_OUTPUT
    if fix == KEEP_OUTPUT and Shown.ACCELERATE in shown:
        return ACCELERATE_OUTPUT
    if fix == STOPPED_OUTSIDE and Shown.SLURM in shown:
        return SLURM_RECORD
    if fix == FLIGHT and Shown.NCCL not in shown:
        return ANY_FLIGHT
    return fix


E = TypeVar("E")


def fitted(explanation: E, shown: set[Shown]) -> E:
    """An Explanation with its fix and its finding's fixed to what the logs show."""
    finding = getattr(explanation, "finding", None)
    if finding is not None:
        finding = replace(finding, fix=fit(finding.fix, shown))
    return replace(explanation, fix=fit(getattr(explanation, "fix", None), shown), finding=finding)  # type: ignore[type-var]
