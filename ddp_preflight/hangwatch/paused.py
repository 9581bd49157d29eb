"""A rank that holds the others up again and again, and each time goes on, is a slow rank (a
straggler), not a stall said over and over. The evidence: a held verdict (a rank asleep or reading
in its own code while the others wait) ended by progress resuming on every rank (its steps came),
and the same rank is held again at the same line. Its step time is the time between the two pauses'
starts (a multiple of it where the watcher judged only some of its pauses). Never certain, never a
hang: a notice, said once per run and rank (state.Said.stands); the held bound (HELD_BOUND, or the
others' own timeout) still makes a pause that never ends the hang. Pure: functions of the
watcher's state."""

from __future__ import annotations

from dataclasses import replace

from .model import Certainty, Diagnosis, Kind
from .state import State


def went_on(state: State) -> None:
    """Progress resumed on every rank: each rank a held verdict named paused and went on; where
    (its lines so far: a straggler may pause at two lines a step) and when (the last pause's start)
    are kept for its next pause."""
    for run, d in state.held.items():
        lines = {e.key: e.frame for e in d.evidence}
        for key in d.culprits:
            before, _ = state.paused.get((run, key), (frozenset(), None))
            line = lines.get(key)
            state.paused[(run, key)] = (before | {line} if line is not None else before, d.since)


def as_straggler(state: State, found: Diagnosis, run: int | None, since: float) -> Diagnosis | None:
    """A held verdict whose every culprit paused at this line before in this run, and went on:
    a straggler, likely, with `every`: seconds from the last pause's start to this one's (its step
    time, or a multiple of it), and none of the held causes (a wait that never ends: this one ended
    each time). None: a first pause, or one somewhere else (a checkpoint after steps)."""
    if found.kind is not Kind.HELD or not found.culprits:
        return None
    lines = {e.key: e.frame for e in found.evidence}
    starts = []
    for key in found.culprits:
        at, start = state.paused.get((run, key), (frozenset(), None))
        if start is None or lines.get(key) not in at:
            return None
        starts.append(start)
    last = max(starts)
    return replace(found, kind=Kind.STRAGGLER, certainty=Certainty.LIKELY, bound=None, causes=(),
                   every=round(max(since - last, 0.0), 1))

