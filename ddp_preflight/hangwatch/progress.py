"""Who still makes progress, from each rank's samples and stacks. Pure updates of the state.

A rank is quiet over a sample when neither it nor its helpers (DataLoader workers, compile
workers: its descendants) used IDLE_CPU of a core and its TCP connections carried no byte since the
last sample (node/wire.py: a collective completed at a few % of a core is progress), or when the
kernel holds it (SIGSTOP, a debugger: state T or t). A quiet rank has stopped, or waits for
another rank that has; its stacks then say which. Its quiet time starts at its last progress of
any kind. (The time its threads wait for a CPU is no
sign of progress: on a busy box a blocked rank's every brief wake-up, a retry or a timer, waits
in the run queue too.) While it is quiet,
the bytes it reads and writes through its own system calls are counted (`moved`): a collective
still moving data on a slow link, a checkpoint going to a slow disk.

A rank can also stop while it uses CPU: a GPU rank's host thread spin-waits in
cudaStreamSynchronize for a kernel that never ends. Its CPU says nothing; its stacks do: taken
every half threshold while it uses CPU on a GPU, two that show it waiting at the same place (a
GPU wait or a collective's wait, the same frames) with no progress between them (its Flight
Recorder's last collective unchanged, where it has one), and no quiet sample since the first,
make it quiet since the first of them.
Progress, not a level of CPU or of GPU memory activity, decides."""

from __future__ import annotations

from ddp_preflight.node import protocol

from . import stall
from .classify import BACKWARD_FILES, classify
from .model import HISTORY, NodeStatus, RankStatus
from .state import State, Track

S = RankStatus


def forget(t: Track) -> None:
    """What its progress was: nothing is judged from it (its node was lost)."""
    t.view.idle_for, t.idle_since, t.busy_at, t.quiet_at, t.moved = 0.0, None, None, None, 0
    t.free_at, t.read_at = None, None
    t.wire, t.wire_at, t.progress_at = None, None, None
    t.spinning, t.last_wait = False, None


def sampled(state: State, t: Track, s: protocol.RankSample, gpu: protocol.GpuSample | None, now: float) -> None:
    v = t.view
    t.proc_state, t.children_cpu = s.state, s.children_cpu
    if s.cpu is None:
        return
    # Progress of any kind ends a quiet time: CPU (its own or its helpers'), or bytes its TCP
    # connections carried since the last sample (a collective completed at a few % of a core: a
    # straggler's peers, a step that is mostly waiting). Its own files (the Flight Recorder's
    # answer to our ask) are no progress.
    # More than before: connections it closed (its end, a timeout's teardown) carry nothing.
    moving = s.wire is not None and t.wire is not None and s.wire > t.wire
    if s.wire is not None:
        t.wire = s.wire
    if moving:
        t.wire_at = now
        if t.spinning:
            t.spinning, t.idle_since = False, None      # its wait ended: its connections carried bytes
    quiet = s.cpu < stall.IDLE_CPU and (s.children_cpu or 0.0) < stall.IDLE_CPU and not moving
    if not s.held:
        t.free_at = now
    if quiet and s.held and t.idle_since is None and not t.stopped and not t.spinning:
        # Our own py-spy held it (suspended to read its stack) during this sample: its CPU was not
        # its to use, so a busy rank read then looks quiet. No sign it stopped (its CPU stays the
        # last it used); one that did is quiet again at its next sample.
        v.history.append(s.cpu)
        del v.history[:-HISTORY]
        return
    v.cpu = s.cpu
    v.history.append(s.cpu)
    del v.history[:-HISTORY]
    v.gpu = s.gpu
    v.gpu_util, v.gpu_memory_util = (gpu.util, gpu.memory_util) if gpu is not None else (None, None)
    interval = state.config.interval
    if quiet:
        t.quiet_at = now
    if quiet or t.stopped or t.spinning:
        if t.idle_since is None:
            # Quiet over this whole sample, and over the part of the one before that it did not
            # use: a rank that computes, then blocks, stops mid-sample. This sample's bytes may be
            # its last collective's, before it stopped: bytes count from the next sample on.
            before = v.history[-2] if len(v.history) > 1 else 100.0
            t.idle_since = now - interval * (2 - min(before, 100.0) / 100)
            if t.wire_at is not None:
                # The quiet clock starts at its last progress of any kind: bytes moved in the sample
                # before this one moved at some time within it.
                t.idle_since = max(t.idle_since, t.wire_at - interval)
            if t.progress_at is not None:
                t.idle_since = max(t.idle_since, t.progress_at)
            t.moved, t.io_known = 0, s.io is not None
        elif s.io is not None:
            t.moved += int(s.io * interval)
            t.io_known = True
    else:
        t.idle_since, t.moved = None, 0
        if not moving or s.cpu >= stall.IDLE_CPU or (s.children_cpu or 0.0) >= stall.IDLE_CPU:
            t.busy_at = now                       # the last sample that used CPU
        if v.state in (S.IDLE, S.COLLECTIVE, S.RENDEZVOUS, S.UNKNOWN, S.STOPPED, S.GPU_WAIT) and t.dump is not None:
            v.state = S.RUNNING          # moving again: the old stack no longer says where
    v.idle_for = round(now - t.idle_since, 1) if t.idle_since is not None else 0.0


def stepped(state: State, node: str, rank: int, step: int, now: float) -> None:
    """A launched rank printed a new step (the launcher read its line): it made progress, whatever
    its CPU. A quiet time it was in ends; the next quiet sample starts one no earlier than this."""
    t = next((t for t in state.live() if t.view.rank == rank and t.view.node == node and not t.duplicate), None)
    if t is None or t.stopped:
        return
    _progressed(t, now)


def flight_read(t: Track, flight: dict, taken: float) -> None:
    """Its Flight Recorder, read with a stack taken at `taken`: a sequence number (or a completed
    one) that moved in any of its process groups since the last read is progress, made after that
    read: it ends a quiet time begun before then."""
    before, at = _numbers(t.view.flight), t.flight_at
    t.view.flight, t.flight_at = flight, taken
    now = _numbers(flight)
    moved = any(isinstance(a, int) and isinstance(b, int) and b > a
                for g, seen in before.items() for a, b in zip(seen, now.get(g, (None, None)), strict=True))
    if moved and at is not None and (t.idle_since is None or at >= t.idle_since or t.spinning):
        _progressed(t, taken)


def _numbers(flight: dict | None) -> dict[str, tuple]:
    """Each process group's (last sequence number, last completed) in a Flight Recorder summary."""
    groups = [g for g in (flight or {}).get("groups") or [] if isinstance(g, dict)]
    return {str(g.get("id") or g.get("group")): (g.get("seq"), g.get("completed")) for g in groups}


def _progressed(t: Track, at: float) -> None:
    t.progress_at = max(at, t.progress_at or at)
    if t.idle_since is not None:
        t.idle_since, t.moved, t.spinning = None, 0, False
        t.view.idle_for = 0.0


def stack_taken(state: State, t: Track, taken: float, now: float) -> None:
    """A new stack: does it show the rank spinning in one wait with no progress?"""
    place = _wait_place(t)
    if place is None:
        if t.spinning:
            t.spinning, t.idle_since = False, None
        t.last_wait = None
        return
    if t.last_wait is None or t.last_wait[0] != place:
        if t.spinning:
            t.spinning, t.idle_since = False, None
        t.last_wait = (place, taken)
        return
    first = t.last_wait[1]
    # Spinning: busy all along at one wait. A rank quiet at some sample since the first of them (a
    # late answer to an ask made while it waited, come after it resumed) was not.
    if not t.spinning and taken - first >= state.config.threshold / 2 and t.idle_since is None \
            and (t.quiet_at is None or t.quiet_at < first):
        t.spinning, t.idle_since, t.moved = True, first, 0
        t.view.idle_for = round(now - first, 1)


def _wait_place(t: Track) -> tuple | None:
    """Where its stack shows it waiting (a collective's wait or a GPU wait): the frames and, when
    its Flight Recorder is known, its last collective (a new one is progress); None when the stack
    shows no wait."""
    if t.dump is None:
        return None
    found = classify(t.dump, None, t.view.wchan, frames=t.frames())
    if found.state not in (S.COLLECTIVE, S.GPU_WAIT):
        return None
    seen = t.frames()
    if seen and seen[0].file.startswith(BACKWARD_FILES) and not any(f.native for f in seen):
        # Python frames alone in backward(): a wait there is inferred from no CPU, never seen; a
        # busy rank found twice in its backward (most of a step) computes its gradients.
        return None
    frames = tuple((f.function, f.file, f.line) for f in seen)
    groups = (t.view.flight or {}).get("groups") or []
    return found.state, found.op, frames, tuple((g.get("group"), g.get("seq"), g.get("state")) for g in groups)


def busy_on_gpu(state: State) -> tuple[str, ...]:
    """The watched nodes with a live rank that uses CPU on a GPU: their stacks are the progress
    that CPU cannot show."""
    return tuple(sorted({t.view.node for t in state.live() if t.view.gpu is not None and t.idle_since is None
                         and state.nodes[t.view.node].status is NodeStatus.WATCHING}))


def read_again(state: State, run: int | None = None) -> bool:
    """Whether its ranks' stacks may be read again: every live rank (of `run`) read by a stall's
    ask has had a sample since whose CPU was its own. py-spy suspends a rank while it reads it (for
    seconds, native frames on a loaded node): asks back to back would hold it for good, and a rank
    only ever read held shows neither quiet nor busy (CI: two ranks that waited in all_reduce were
    named computing for 28 s, their CPU the last they had used before)."""
    return not any(t.held_since_read() for t in state.live() if run is None or t.run == run)


def went_quiet(state: State, run: int | None = None) -> float | None:
    """When the last of the quiet ranks (of `run`) went quiet: stacks asked for before then
    cannot show where they all are now."""
    return max((t.idle_since for t in state.live() if (run is None or t.run == run) and t.idle_since is not None),
               default=None)


def stalled(state: State, now: float, run: int | None = None) -> tuple[float, bool, float | None] | None:
    """(how long progress has stopped, whether the stacks in hand were taken after every quiet rank
    went quiet, how old the newest is) when some rank (of `run`, when given) is quiet; None when
    none is."""
    live = [t for t in state.live() if run is None or t.run == run]
    quiet = [t for t in live if t.idle_since is not None]
    if not quiet:
        return None
    waiting = max(now - t.idle_since for t in quiet if t.idle_since is not None)
    gone = [t.gone_at for t in state.ranks.values() if t.ended and t.gone_at is not None and t.run in
            {q.run for q in quiet}]
    if gone:
        # A rank of its run is gone while others are quiet: the stall began when it left.
        waiting = max(waiting, now - min(gone))
    covered = all(t.stack_at is not None and t.idle_since is not None and t.stack_at >= t.idle_since for t in quiet)
    newest = max((t.stack_at for t in live if t.stack_at is not None), default=None)
    return waiting, covered, None if newest is None else now - newest
