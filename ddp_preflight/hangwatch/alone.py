"""Ranks of one world that never join a process group: each trains alone (nanochat on CPU without
its Gloo patch, a one-process script started by torchrun). Not a hang: nothing stops the run, and
it is said once, as a notice, and taken back if a rank connects after all.

What decides it, for every rank of a world of more than one (WORLD_SIZE > 1):
- it imported torch (torch's library is mapped in it: a script that only prints is no rank that
  trains), and
- it has used CPU with not a single TCP connection (its store and its peers are connections).
Within the threshold when its stacks show each rank in a training step of its own (backward, an
optimizer's step, a module's forward: work a rank does only after the point where a script
creates its process group); else after ALONE_AFTER, the time any script's set-up before
init_process_group (imports, reading data) is given."""

from __future__ import annotations

from dataclasses import replace

from ddp_preflight.node import protocol

from .classify import BACKWARD_FILES
from .diagnose import trains_alone
from .events import Event, EventKind
from .evidence import evidence_of, shown
from .inputs import Effect, Say
from .model import Diagnosis, Kind, NodeStatus, RankStatus, Reason
from .runs import never_connected
from .state import State, Track, snapshot

ALONE_AFTER = 30.0        # seconds every rank works with no connection before "each rank trains alone"
OPTIMIZER_FILES = ("torch/optim/",)
MODULE_CALL = ("torch/nn/modules/module.py", ("_call_impl", "_wrapped_call_impl"))


def connections(state: State, node: str, msg: protocol.Sample, now: float, wall: float, out: list[Effect]) -> None:
    """Each rank's TCP connections, counted every few samples: a rank with none at all has
    joined no process group (its store and its peers are connections). Whatever shows a connection
    of its own excludes it, whenever a count missed it (a count between two short-lived
    connections, on a loaded box): bytes its connections carried (wire), its connections
    listed, a stack of it in a collective or in init_process_group."""
    counted = False
    for s in msg.ranks:
        t = state.ranks.get((node, s.pid))
        if t is None:
            continue
        if s.wire or s.links or _joined(t):
            t.talked, t.alone_since, t.training = True, None, None
        if s.tcp is None:
            continue
        counted = True
        t.torch = t.torch or bool(s.torch)
        if s.tcp:
            t.talked, t.alone_since, t.training = True, None, None
        elif t.alone_since is None and not t.talked:
            t.alone_since = now
    if counted:
        judge(state, now, wall, out)


def _joined(t: Track) -> bool:
    """Its stack shows it in a collective or creating its process group: it joined one, or is
    joining (its store is a connection)."""
    return t.view.state in (RankStatus.COLLECTIVE, RankStatus.RENDEZVOUS)


def training_step(frames) -> str | None:
    """The training step a stack (innermost first) shows, named by the call the training's own
    line made into torch (the outermost of torch's frames under it that says one): "backward at
    train.py:42"; None when it shows none."""
    below: list = []          # library frames under the user's line, innermost first
    for f in frames:
        if f.native:
            continue
        if not f.in_library:
            if not below or below[-1].function.rsplit(".", 1)[-1] == "__init__":
                return None   # set-up: the line builds a model or an optimizer (torch.optim.SGD(...))
            what = next((w for w in map(_step, reversed(below)) if w is not None), None)
            return f"{what} at {f.where}" if what is not None else None
        below.append(f)
    return None


def _step(f) -> str | None:
    function = f.function.rsplit(".", 1)[-1]
    if f.file.startswith(BACKWARD_FILES) and "backward" in function:
        return "backward"
    if f.file.startswith(OPTIMIZER_FILES) and ("step" in f.function or "zero_grad" in f.function):
        return "its optimizer"
    if f.file == MODULE_CALL[0] and function in MODULE_CALL[1]:
        return "a module's forward"
    return None


def judge(state: State, now: float, wall: float, out: list[Effect]) -> bool:
    """Say it, once, when it holds; True when stacks would decide it sooner (the caller takes
    them)."""
    if state.alone:
        _taken_back(state, out)
        return False
    live = state.live()
    world = [t for t in live if (t.view.world_size or 0) > 1]
    if not world or len(world) < len(live) or \
            any(state.nodes[t.view.node].status is not NodeStatus.WATCHING for t in world):
        return False
    quiet = [t for t in world if t.torch and t.alone_since is not None and t.busy_at is not None
             and t.busy_at >= t.alone_since]
    if len(quiet) < len(world):
        return False
    # A rank of that world that already finished its own training (exit 0, never a connection) is
    # one of them still: a fast rank's end does not take it out (lab, quiet box: two of four ranks
    # done in 12 s, and the others were said to be the world).
    size = max(t.view.world_size or 0 for t in world)
    done = [t for t in state.ranks.values() if t.ended and t.view.world_size == size and t.torch
            and t.alone_since is not None and not t.talked and t.exit_status is not None and t.exit_status.ok]
    seconds = min(now - (t.alone_since or now) for t in quiet)
    threshold = state.config.threshold
    if seconds < threshold:
        return False
    for t in quiet:
        if t.training is None and t.dump is not None and t.stack_at is not None and \
                t.stack_at >= (t.alone_since or now):
            t.training = training_step(t.frames())
    # Every rank of the world seen, each in its own step: said within the threshold. Ranks of it
    # not seen (a node not watched, a rank not found yet): only after ALONE_AFTER, of those seen.
    whole = len(quiet) + len(done) >= size
    stepping = whole and all(t.training is not None for t in quiet)
    if stepping or seconds >= ALONE_AFTER:
        _say(state, sorted(quiet + done, key=lambda t: (t.view.rank is None, t.view.rank or 0)), seconds, now,
             wall, out, stepping)
        return False
    # Stacks taken anew each threshold until ALONE_AFTER: one may catch each rank in its step.
    return state.asked_at is None and \
        any(t.stack_at is None or now - t.stack_at >= threshold for t in quiet if t.training is None)


def _say(state: State, quiet: list[Track], seconds: float, now: float, wall: float, out: list[Effect],
         stepping: bool) -> None:
    seen = []
    for t in quiet:
        e = evidence_of(state, t, now)
        shown(state, t, e)
        until = t.gone_at if t.ended and t.gone_at is not None else now
        notes = [f"no TCP connection for {until - (t.alone_since or until):.0f} s", f"CPU {t.view.cpu:.0f}%",
                 "torch imported"]
        if t.training is not None:
            notes.append(f"in {t.training}")
        seen.append(replace(e, notes=tuple(notes), step=t.training))
    found = trains_alone(seen, max(t.view.world_size or 0 for t in quiet), seconds,
                         Reason.TRAINING if stepping else None)
    state.alone = tuple((t.view.node, t.view.pid) for t in quiet)
    if state.diagnosis is None:
        state.diagnosis = found.as_reported(round(wall - seconds, 3))
    out.append(Say(Event(EventKind.NOTICE, snapshot=snapshot(state, wall), data={"alone": True},
                         verdict=found.as_reported(round(wall - seconds, 3)))))


def at_end(state: State, now: float, wall: float, keys: set | None = None) -> Diagnosis | None:
    """The run's verdict when it ended with every rank exited 0 and none ever in a process group
    (`keys`: those ranks, by default runs.never_connected's): the notice said while it ran, else
    one made now (a run shorter than the threshold had none). None where some rank is not one."""
    keys = set(never_connected(state)) if keys is None else keys
    tracks = sorted((t for t in state.ranks.values() if t.key in keys),
                    key=lambda t: (0, t.key, "") if isinstance(t.key, int) else (1, 0, str(t.key)))
    if not tracks or len(tracks) < len(state.ranks):
        return None
    if state.diagnosis is not None and state.diagnosis.kind is Kind.ALONE:
        return state.diagnosis
    seen, lasted = [], {}
    for t in tracks:
        e = evidence_of(state, t, now)
        ran = lasted[t.key] = (t.gone_at if t.gone_at is not None else now) - (t.alone_since or now)
        ran_none = isinstance(t.ending, dict) and t.ending.get("collectives") == 0
        seen.append(replace(e, notes=(f"no TCP connection in {ran:.0f} s", "torch imported")
                            + (("no collective (its Flight Recorder)",) if ran_none else ())))
    seconds = max(lasted.values())
    found = trains_alone(seen, max(t.view.world_size or 0 for t in tracks), seconds)
    return found.as_reported(round(wall - seconds, 3))


def _taken_back(state: State, out: list[Effect]) -> None:
    """A rank said to train alone connected later (a process group created late): said so."""
    late = [t for key in state.alone if (t := state.ranks.get(key)) is not None and t.talked]
    if late:
        state.alone = ()
        if state.diagnosis is not None and state.diagnosis.kind is Kind.ALONE:
            state.diagnosis = None
        out.append(Say(Event(EventKind.NOTICE, data={"alone": False}, connected=tuple(sorted(t.key for t in late)))))


__all__ = ["ALONE_AFTER", "connections", "judge", "training_step"]
