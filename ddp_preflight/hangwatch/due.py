"""When the tick must judge again (issue 36). The tick (4 Hz) judged every run over every rank each
time, though what it decides changes only when an input arrives (a sample, a stack, an exit, a node
lost) or when time passes a bound a verdict reads: half the threshold and the threshold of a stall,
its recheck, the held and endless bounds, an ask's timeout, a store's read, an exit awaited, a
torchrun's quiet, a rank alone. Each such bound is `anchor + seconds`; `next_due` gives the earliest
one still ahead, and the tick judges again only at an input or once that time has come.

Every condition of the tick's judging that reads the clock is listed here beside where it is read;
a new one read there must give its time here. Early is harmless (the judging finds nothing new);
late would delay a verdict. Pure: reads the state, changes nothing."""

from __future__ import annotations

from collections.abc import Iterator

from . import stall
from .alone import ALONE_AFTER
from .ended import EXIT_WAIT
from .state import State
from .verdicts import STORE_WAIT

# Clock readings a bound is compared with may differ from `anchor + seconds` in their last bit: a
# bound this close to now counts as now (judged at the next tick too).
SLACK = 1e-6


def next_due(state: State, now: float) -> float | None:
    """The earliest time, `now` or later, at which a condition of the tick's judging that reads the
    clock can turn; None when none can (only an input changes what the tick decides)."""
    return min((at for at in _bounds(state, now) if at >= now - SLACK), default=None)


def _bounds(state: State, now: float) -> Iterator[float]:
    config = state.config
    threshold = config.threshold
    # A run's ends, judged once they settled (reducer._tick), unless an exit message is awaited
    # (ended.awaited: EXIT_WAIT after the rank was seen gone, also a stall's ends_coming).
    if state.exit_check_at is not None:
        yield max(state.exit_check_at, now)
    # Stacks asked of ranks that use CPU on a GPU, every half threshold (reducer._tick).
    if state.spin_asked_at is not None:
        yield state.spin_asked_at + threshold / 2
    # An ask unanswered covers a stall for ASK_TIMEOUT (stall.plan).
    if state.asked_at is not None:
        yield state.asked_at + stall.ASK_TIMEOUT
    # A store being read is waited for (verdicts._store_coming).
    for began in state.reading.values():
        yield began + STORE_WAIT
    # Torchruns quiet for the threshold (verdicts.launchers_waiting).
    for launcher in state.launchers.values():
        if launcher.quiet_since is not None:
            yield launcher.quiet_since + threshold
    started: dict[int, float] = {}      # run -> when its stall began (progress.stalled's `waiting`)
    newest: dict[int, float] = {}       # run -> its live ranks' newest stack (stall.plan's stacks_age)
    gone: dict[int, float] = {}         # run -> its first end
    for t in state.ranks.values():
        if t.ended:
            if t.gone_at is not None:
                yield t.gone_at + EXIT_WAIT                      # ended.awaited
                gone[t.run] = min(gone.get(t.run, t.gone_at), t.gone_at)
            continue
        if t.idle_since is not None:
            started[t.run] = min(started.get(t.run, t.idle_since), t.idle_since)
        if t.stack_at is not None:
            newest[t.run] = max(newest.get(t.run, t.stack_at), t.stack_at)
            yield t.stack_at + threshold                         # alone.judge: stacks again each threshold
        if t.alone_since is not None:
            yield t.alone_since + threshold                      # alone.judge
            yield t.alone_since + ALONE_AFTER
    for run, quiet_since in started.items():
        # progress.stalled: the stall began when its first rank went quiet, or its first rank left.
        began = min(quiet_since, gone[run]) if run in gone else quiet_since
        yield began + threshold / 2                              # stall.plan: stacks taken
        yield began + threshold                                  # stall.plan: judged
        yield began + threshold + stall.RECHECK                  # verdicts.stall_of: placing
        yield began + config.held_after                          # waiting.deadlock: a held rank's bound
        yield began + config.endless                             # stalled.held_up_by: endless
        if run in newest:
            yield newest[run] + stall.RECHECK                    # stall.plan: stacks stale
