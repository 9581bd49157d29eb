"""When the tick must judge again (issue 36). The tick (4 Hz) judged every run over every rank each
time, though what it decides changes only when an input arrives (a sample, a stack, an exit, a node
lost) or when time passes a bound a verdict reads: half the threshold and the threshold of a stall,
its recheck, the held and endless bounds, an ask's timeout, a store's read, an exit awaited, a
torchrun's quiet, a rank alone. Each such bound is `anchor + seconds`; `next_due` gives the earliest
one still ahead, and the tick judges again only at an input or once that time has come.

Every condition of the tick's judging that reads the clock is listed here beside where it is read;
a new one read there must give its time here. Early is harmless (the judging finds nothing new);
late would delay a verdict.

An input is a change, with one exception: a node's sample (every second, every node) rewrites its
ranks' figures whether or not anything the judging decides by moved: the last sample's time, the
CPU a rank idles at (0% then 1%), its CPU history. A sample is a change only when what the judging
reads of its ranks and of the state changed (`sample_reads`); the figures a verdict shows but no
rule decides by (a rank's CPU figure, its helpers', its history) are read afresh whenever a
judging runs, and a verdict that shows them is restated, and judged again, at every tick anyway
(reducer._tick: a restated verdict is a move). Pure: reads the state, changes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import fields
from operator import attrgetter

from ddp_preflight.node import protocol

from . import stall
from .alone import ALONE_AFTER
from .classify import BUSY_CPU
from .ended import EXIT_WAIT
from .model import RankView
from .state import State, Track
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
        if t.alone_since is not None:
            yield t.alone_since + threshold                      # alone.judge
            yield t.alone_since + ALONE_AFTER
            if t.stack_at is not None:
                yield t.stack_at + threshold                     # alone.judge: its stack again each threshold
                                                                 # (read of ranks alone only)
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


# -- which samples are a change -------------------------------------------------------------------
# Every field of a rank's track and view is read, but for these, which a sample rewrites and which
# the judging reads only as what follows (a field added later is read whole: a change at worst):
# quiet_at, wire_at   progress.sampled and progress.stack_taken alone (inputs')
# free_at        as held_since_read() (evidence.py, verdicts.stall_of, progress.read_again)
# busy_at        against its stack's time and its read's (evidence._stale, verdicts._left_rendezvous_unseen)
#                and against alone_since (alone.judge)
# wire           against the wire when the hang was said (verdicts.resumed)
# proc_state     stopped, traced (Track.stopped), in uninterruptible wait (evidence.py); running or
#                asleep is read by no judging
# children_cpu   as known or not (evidence.py); its figure is a note's
# view.cpu       as busy or not (classify, evidence._stale: BUSY_CPU); its figure is a note's
# view.history   verdicts._wait_share alone: a straggler's idle share, a figure
# view.idle_for  set by every tick, shown, read by no judging
# view.gpu_util, view.gpu_memory_util   shown, read by no judging
# read           frames_of's cache of the stack (the stack itself is read)
_SKIPPED = {"view", "read", "quiet_at", "wire_at", "free_at", "busy_at", "wire", "proc_state", "children_cpu"}
_VIEW_SKIPPED = {"cpu", "history", "idle_for", "gpu_util", "gpu_memory_util"}
_track_fields = attrgetter(*(f.name for f in fields(Track) if f.name not in _SKIPPED))
_view_fields = attrgetter(*(f.name for f in fields(RankView) if f.name not in _VIEW_SKIPPED))


def judged_of(state: State, t: Track) -> tuple:
    """What the judging reads of a rank, less the figures it only shows (above)."""
    v, busy, stack = t.view, t.busy_at, t.stack_at
    worked = busy is not None and stack is not None and busy > stack
    since = max(stack, t.read_at if t.read_at is not None else stack) if stack is not None else None
    return (_track_fields(t), _view_fields(v), v.cpu >= BUSY_CPU, t.children_cpu is None, t.held_since_read(),
            t.proc_state if t.proc_state in ("T", "t", "D") else None,
            busy is None, worked, worked and busy is not None and since is not None
            and busy - state.config.interval >= since,
            busy is not None and t.alone_since is not None and busy >= t.alone_since,
            t.wire is None, t.wire is not None and t.wire <= state.wires_at_hang.get(t.key, t.wire))


def figures_of(t: Track) -> tuple:
    """What a rank's evidence shows of it beyond what the judging decides by: its kept evidence
    (kept.py) is built again when these move too."""
    return t.view.cpu, t.children_cpu


def sample_reads(state: State, node: str, sample: protocol.Sample) -> tuple[tuple, tuple, object]:
    """(what the judging reads that `sample` can change, its ranks' figures): the ranks it names
    (the only ones it touches: agents._sample, alone.connections) and the state's parts it can
    move (a rank ended, a torchrun's CPU, a closure seen, a node's clock, a node watched again)."""
    tracks = [state.ranks.get((node, pid)) for pid in [s.pid for s in sample.ranks] + list(sample.gone)]
    ranks = tuple(judged_of(state, t) if t is not None else None for t in tracks)
    launchers = tuple((key, launcher.quiet_since, launcher.ranks, launcher.had_ranks)
                      for key, launcher in state.launchers.items() if key[0] == node)
    whole = (state.nodes[node].status if node in state.nodes else None, state.clock_gap.get(node), launchers,
             frozenset(state.formed), len(state.closures), len(state.gpu_nodes), len(state.ranks), state.runs,
             state.exit_check_at, state.asked_at, len(state.asked), len(state.native_due), len(state.messages),
             len(state.lost), state.alone, len(state.held), len(state.reported))
    return (ranks, whole), tuple(figures_of(t) if t is not None else None for t in tracks), state.diagnosis


def sample_moved(before: tuple, after: tuple) -> tuple[bool, bool]:
    """(whether the judging reads anything the sample changed, whether a rank's kept evidence
    must be built again), from sample_reads before and after it (the verdict compared by identity:
    a new one is a change, whatever it holds)."""
    judged = before[0] != after[0] or before[2] is not after[2]
    return judged, judged or before[1] != after[1]
