"""The watcher's logic, as a reducer: `step(state, input, now, wall) -> effects`. It only dispatches.

Pure: no threads, no clock, no I/O. The inputs are what happened (an agent's message, an agent
that closed, time passing, a bundle written, what a launcher knows), the effects what the shell
(watch.py) must do (say an event, ask the agents for stacks, write a bundle, bring py-spy to a
node). `now` is monotonic seconds, `wall` the epoch time for what is shown. The state is updated
in place, by the parts that own each piece (bench/hangwatch_scale.py replays 1,024 ranks through
it):

- inputs.py      what comes in, what goes out (the Input and Effect unions)
- state.py       what is held: nodes, ranks (Track), what was said (Said)
- agents.py      the agents' messages into the state
- runs.py        which processes are followed, the run each belongs to (its user, store, world)
- progress.py    who still makes progress (CPU, helpers, the kernel's state, spinning stacks)
- ended.py       how each rank ended, from every source; exits.py judges a run's ends
- evidence.py    each rank's evidence, read from the state without changing it
- verdicts.py    what a stalled run shows (stalled.Stall), handed to the one pipeline that decides
                 (diagnose.py); saying each verdict once
- kept.py        each rank's evidence kept until an input about its node (counted here) arrives
- due.py         when the tick must judge again: at an input that moved what it reads (a sample only
                 where it did), or once time passes a bound a verdict reads
No words are written here: the events carry the verdicts, and the shell (watch.py) renders their
lines at the edge (render.py, text.py)."""

from __future__ import annotations

from ddp_preflight.node import protocol

from . import agents, alone, due, ended, kept, progress, runs, stall, verdicts
from .alone import ALONE_AFTER
from .diagnose import Hold
from .events import Event, EventKind
from .inputs import (
    AgentClosed,
    AgentFailed,
    AskStacks,
    BringPySpy,
    BundleAsked,
    BundleFailed,
    BundleWritten,
    Effect,
    FromAgent,
    HangNamed,
    Input,
    LauncherStopping,
    Notice,
    RankEnded,
    RankError,
    RankStepped,
    Say,
    Send,
    Stopping,
    TakeStacks,
    Tick,
    WriteBundle,
)
from .model import NodeStatus, stops
from .state import Config, State, details, new_state, notice, snapshot

EXIT_SETTLE = 2 * Config().interval     # seconds after the last end before a run's ends are judged (default)

__all__ = ["ALONE_AFTER", "EXIT_SETTLE", "AgentClosed", "AgentFailed", "AskStacks", "BringPySpy", "BundleAsked", "BundleFailed",
           "BundleWritten", "Config", "Effect", "FromAgent", "HangNamed", "Input", "LauncherStopping", "Notice", "RankEnded",
           "RankError", "RankStepped", "Say", "Send", "State", "Stopping", "TakeStacks", "Tick", "WriteBundle", "details",
           "new_state", "snapshot", "step"]


def step(state: State, event: Input, now: float, wall: float) -> list[Effect]:
    """Apply one input; the effects the shell must carry out, in order."""
    out: list[Effect] = []
    # What a rank's kept evidence was read from may change (kept.py): counted before and after the
    # input, so nothing derived while it is taken is kept past it.
    # A node's samples and stacks are about its own ranks; its other messages (a rank found, which can
    # make another node's a duplicate or start a run) may be about any. Time passing, notices, asks
    # and bundles change no rank's inputs; a tick can lose a node (its status is in the key).
    about = event.node if isinstance(event, (AgentClosed, AgentFailed, RankEnded, RankError, RankStepped)) or \
        isinstance(event, FromAgent) and isinstance(event.message, (protocol.Sample, protocol.Stacks)) else None
    if isinstance(event, FromAgent) and isinstance(event.message, protocol.Sample):
        # A sample is a change only where it moved what the judging reads (due.sample_reads); no
        # judging reads kept evidence while one is taken, so it is counted after it alone.
        before = due.sample_reads(state, event.node, event.message)
        _take(state, event, now, wall, out)
        judged, evidence = due.sample_moved(before, due.sample_reads(state, event.node, event.message))
        # A verdict said again at the last judging shows its ranks' figures: they moved (verdicts._restate).
        if judged or out or state.restated is not None and state.restated == state.judgements:
            state.changes += 1
        if evidence or out:
            kept.moved(state, about)
        return out
    moves = not isinstance(event, (Tick, Notice, BundleWritten, BundleAsked, BundleFailed, TakeStacks, Stopping))
    if not isinstance(event, Tick):
        state.changes += 1          # the tick judges again after any input (_tick)
    if moves:
        kept.moved(state, about)
    _take(state, event, now, wall, out)
    if moves:
        kept.moved(state, about)
    return out


def _take(state: State, event: Input, now: float, wall: float, out: list[Effect]) -> None:
    if isinstance(event, FromAgent):
        agents.from_agent(state, event.node, event.message, now, wall, out)
        verdicts.bundle_when_complete(state, wall, out)
    elif isinstance(event, Tick):
        _tick(state, now, wall, out)
        verdicts.bundle_when_complete(state, wall, out)
    elif isinstance(event, AgentClosed):
        if not state.stopping:
            agents.lose(state, event.node, agents.GONE, f"{event.node}: the agent stopped "
                        f"({event.why or 'its SSH channel closed'}); the other nodes are still watched", out)
    elif isinstance(event, AgentFailed):
        agents.set_node(state, event.node, NodeStatus.ERROR, event.why, out)
    elif isinstance(event, Notice):
        notice(state, event.text, out)
    elif isinstance(event, BundleWritten):
        state.incidents.append(event.path)
        out.append(Say(Event(EventKind.INCIDENT, f"incident bundle: {event.path}", data={"path": event.path})))
        out.append(HangNamed(event.path, state.diagnosis is not None and stops(state.diagnosis)))
    elif isinstance(event, BundleAsked):
        state.incidents.append(event.path)
    elif isinstance(event, BundleFailed):
        notice(state, f"hangwatch: could not write the incident bundle: {event.why}", out)
    elif isinstance(event, TakeStacks):
        agents.ask_stacks(state, now, out)
    elif isinstance(event, Stopping):
        state.stopping = True
        state.native_due.clear()                # the watch ends: a hang's bundle is written with what came
        verdicts.bundle_when_complete(state, wall, out)
    elif isinstance(event, LauncherStopping):
        ended.launcher_stopping(state, event, wall)
    elif isinstance(event, RankError):
        ended.rank_error(state, event)
    elif isinstance(event, RankEnded):
        ended.rank_ended(state, event, now, out)
    elif isinstance(event, RankStepped):
        progress.stepped(state, event.node, event.rank, event.step, now)
        ended.went_on(state, event.node, event.rank)


def _tick(state: State, now: float, wall: float, out: list[Effect]) -> None:
    lost = agents.silent(state, now)
    for node, quiet in lost:
        agents.lose(state, node, agents.SILENT, f"{node} lost: its agent has sent nothing for {quiet:.0f} s (the "
                    "link or the node is down); its ranks are unknown until it reports again; the other nodes "
                    "are still watched", out)
    if lost:
        state.changes += 1          # its ranks are unknown now: judged again
    agents.clocks_due(state, now, wall, out)
    for t in state.live():
        t.view.idle_for = round(now - t.idle_since, 1) if t.idle_since is not None else 0.0
    # Judged only when something changed: an input since the last judging, or a bound a verdict
    # reads passed (due.py). Between them the judging would decide what it decided (issue 36).
    if state.judged == state.changes and (state.due is None or now < state.due - due.SLACK):
        return
    before = _judged_marks(state, out)
    state.judgements += 1
    _judge(state, now, wall, out)
    state.judged = state.changes
    # What the judging itself changed (an ask, a verdict said or restated with its time, a held
    # rank remembered) is read by the next: judged again at the next tick, until nothing moves.
    after = _judged_marks(state, out)
    moved = after != before
    state.due = now if moved else due.next_due(state, now)


def _judged_marks(state: State, out: list[Effect]) -> tuple:
    """What the judging writes that the next judging reads: counts, times and values. Of the verdict
    standing, what a judging decides by (consequence, report's standing hang, alone, resumed, a
    bundle's hang): whether there is one, its kind, how sure, whom it names;
    what it shows besides (its ranks' figures, how long they waited) the next judging reads only to
    say it again the same (verdicts._restate), from the same inputs. The wires at a hang, by value."""
    d = state.diagnosis
    said = None if d is None else (d.kind, d.certainty, tuple(d.culprits), tuple(d.candidates), d.reason)
    return ((len(out), state.exit_check_at, state.spin_asked_at, state.asked_at, state.diagnosis_run,
             len(state.reported), len(state.held), len(state.paused), state.alone, len(state.bundles_due), said,
             state.wires_at_hang),)


def _judge(state: State, now: float, wall: float, out: list[Effect]) -> None:
    """Every run judged: its ends once settled, its ranks that spin on a GPU, its torchruns that
    wait, ranks alone, its stall."""
    if state.exit_check_at is not None and now >= state.exit_check_at and not ended.awaited(state, now):
        state.exit_check_at = None
        found = ended.judge(state, now, wall)
        if found is not None:
            verdicts.report(state, found, 0.0, wall, out, verdicts.ends_said(found), run=ended.last_run(state))
    spinning = progress.busy_on_gpu(state)
    if spinning and (state.spin_asked_at is None or now - state.spin_asked_at >= state.config.threshold / 2) \
            and state.asked_at is None and progress.read_again(state):
        state.spin_asked_at = now
        agents.ask_stacks(state, now, out, spinning)
    verdicts.launchers_waiting(state, now, wall, out)
    if alone.judge(state, now, wall, out):
        # Python frames say whether a rank is in a training step; native ones would stop it for seconds.
        agents.ask_stacks(state, now, out, native=False)
    stopped = runs.quiet_runs(state)
    watched = [t for t in state.live() if state.nodes[t.view.node].status is NodeStatus.WATCHING]
    if not stopped:
        # Progress is seen on watched nodes only: a lost node's ranks are neither quiet nor not.
        if watched:
            verdicts.resumed(state, out)
        return
    # Each run on its own: one run's stall, its stacks still to come or its store being read never
    # holds back the verdict on another (a process that only claims to be a rank is a run of its own).
    take = False
    for run in stopped:
        stalled = progress.stalled(state, now, run)
        if stalled is None:
            continue
        waiting, covered, stacks_age = stalled
        # An ask still unanswered that was made before the last rank went quiet (a user's d, a node
        # watched again, on a loaded box answered late) cannot cover the stall: it holds no new ask.
        last_quiet = progress.went_quiet(state, run)
        pending = state.asked_at is not None and (last_quiet is None or state.asked_at >= last_quiet)
        plan = stall.plan(waiting, state.config.threshold, covered, stacks_age,
                          now - state.asked_at if pending and state.asked_at is not None else None)
        # Not while a rank its last answer read has had no sample of its own since (our py-spy held it).
        take = take or (plan.take_stacks and progress.read_again(state, run))
        if plan.diagnose and verdicts.stalled(state, waiting, now, wall, out, run) is Hold.PLACING \
                and state.asked_at is None:
            take = take or progress.read_again(state, run)     # its stack again, before a verdict leaves it out
    if take:
        agents.ask_stacks(state, now, out)
