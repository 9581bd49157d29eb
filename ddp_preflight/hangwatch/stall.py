"""When progress has stopped, and when to look at the stacks. Pure: functions of the ranks'
idle times and of when the last stacks were taken.

A rank is idle when its whole process used under IDLE_CPU of a core over a sample: a rank
blocked in a Gloo or NCCL wait, or sleeping, sits there. A training step alternates compute and
communication in well under a second, so a rank idle for seconds has stopped making progress,
or waits for another rank that has. The stacks then say which.

A stack taken after a rank became idle still shows where it is, as long as it stays idle: it
cannot have moved without CPU. So the stacks are taken early in a stall (at half the threshold),
and the hang is named the moment the threshold passes."""

from __future__ import annotations

from dataclasses import dataclass

from .classify import BUSY_CPU

IDLE_CPU = BUSY_CPU       # percent of one core: below it, a rank is idle
DEFAULT_THRESHOLD = 8.0   # seconds idle before a hang is named
RECHECK = 10.0            # while a stall lasts, look at the stacks again this often
ASK_TIMEOUT = 15.0        # stacks asked for and not all come: ask again after this
# Seconds a rank may sit in its own code (asleep, reading stdin, a pipe or a socket, on a disk) while
# the others wait, before the wait is taken as one that never ends: such a wait can end by itself (a
# checkpoint, an evaluation, a data pause), so until then it is said as likely, never as a hang.
# Far above one step of any run watched here (0.05-6 s) and above a 60 s checkpoint; below
# torch's default process-group timeout (30 min for Gloo, 10 for NCCL), which ends it anyway.
HELD_BOUND = 300.0


@dataclass(frozen=True)
class StallStep:
    take_stacks: bool      # ask every node for every rank's stack now
    diagnose: bool         # the stacks in hand show every idle rank where it is now


def plan(idle_for: float, threshold: float, covered: bool, stacks_age: float | None,
         asked_age: float | None) -> StallStep:
    """idle_for: the longest time any live rank has been idle. covered: the last stacks were
    taken after every idle rank became idle. stacks_age: seconds since they were taken.
    asked_age: seconds since stacks were asked for and have not all come (None: none pending)."""
    if idle_for < threshold / 2:
        return StallStep(False, False)
    stale = not covered or (stacks_age is not None and stacks_age > RECHECK)
    pending = asked_age is not None and asked_age < ASK_TIMEOUT
    return StallStep(stale and not pending, covered and idle_for >= threshold)
