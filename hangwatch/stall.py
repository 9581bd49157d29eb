"""When progress has stopped, and when to look at the stacks. Pure: functions of the ranks'
idle times and the time of the last stacks.

A rank is idle when its whole process used under IDLE_CPU of a core over a sample: a rank
blocked in a Gloo or NCCL wait, or sleeping, sits there. A training step alternates compute and
communication in well under a second, so a rank idle for seconds has stopped making progress,
or waits for another rank that has. The stacks then say which."""

from __future__ import annotations

from dataclasses import dataclass

IDLE_CPU = 5.0            # percent of one core
DEFAULT_THRESHOLD = 8.0   # seconds idle before a hang is named
LEAD = 1.5                # take the stacks this long before the threshold, so they are ready at it
RECHECK = 4.0             # while ranks wait on a straggler, look again this often


@dataclass(frozen=True)
class Plan:
    take_stacks: bool      # ask every node for every rank's stack now
    diagnose: bool         # the stacks in hand are fresh enough to name a hang


def stalled_for(idle: list[float]) -> float:
    """How long progress has stopped: the longest time any live rank has been idle."""
    return max(idle, default=0.0)


def plan(idle_for: float, threshold: float, stacks_age: float | None, asked_age: float | None) -> Plan:
    """`stacks_age`: seconds since the newest complete stacks were taken (None: never);
    `asked_age`: seconds since stacks were last asked for and have not all come (None: none
    outstanding)."""
    if idle_for < threshold - LEAD:
        return Plan(False, False)
    # Fresh: taken after the stall was at least threshold - LEAD - 0.5 s old, so every rank
    # that is idle now was already idle in them.
    fresh = stacks_age is not None and stacks_age <= idle_for - (threshold - LEAD - 0.5)
    recheck = stacks_age is not None and stacks_age > RECHECK
    take = (not fresh or recheck) and (asked_age is None or asked_age > 10.0)
    return Plan(take, fresh and idle_for >= threshold)
