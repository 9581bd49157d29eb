"""The watcher's part in its verdicts: it gathers what a stalled run shows from the state
(stalled.Stall: every rank's evidence, how its ended ranks ended, its store's answer, how long it
has waited) and hands it to the one pipeline that decides (diagnose.py); it gathers the torchruns
that wait, and the ranks that never connect, for their own rules; and it says each verdict once,
a hang with a bundle. It decides nothing itself and writes no verdict's words: the events carry
the verdict, and the watcher's shell renders their lines (render.event_text)."""

from __future__ import annotations

from dataclasses import replace

from ddp_preflight.node import protocol
from ddp_preflight.node.store import READ_TIMEOUT
from ddp_preflight.rules import failures
from ddp_preflight.rules.failures import Part

from . import ended, kept, meshes, paused, stall
from .classify import classify
from .diagnose import Hold, decide
from .events import Event, EventKind
from .inputs import Effect, Say, WriteBundle
from .model import Certainty, Diagnosis, Evidence, Kind, NodeStatus, RankStatus
from .rendezvous import Torchrun, torchruns_waiting
from .stalled import Stall
from .state import About, Said, State, Track, details, remember, say, snapshot
from .who import Who

S = RankStatus
STORE_WAIT = READ_TIMEOUT + 2.0   # seconds a store being read is waited for (the read's bound, and the way back)


# -- when progress has stopped -----------------------------------------------------------------

def stalled(state: State, waiting: float, now: float, wall: float, out: list[Effect],
            run: int | None = None) -> Hold | None:
    """Progress stopped `waiting` seconds ago in `run` (None: every run with a quiet rank) and the
    stacks in hand show where every quiet rank of it is. Each run is judged alone: another run's
    ranks (another user's, another store's) are neither culprits nor victims of its verdict."""
    if run is None:
        for each in sorted({t.run for t in state.live() if t.idle_since is not None}):
            stalled(state, waiting, now, wall, out, each)
        return None
    if stopped_by_us(state):
        return None      # its own freeze (SIGSTOP) and stop: never a hang of the ranks
    tracks = [t for t in state.ranks.values() if t.run == run]
    found = decide(stall_of(state, run, tracks, waiting, now, wall))
    if isinstance(found, Hold):
        return found
    report(state, found, waiting, wall, out, Said(About.STALL, found.kind, tuple(found.named), run=run), run=run)
    return None


def stall_of(state: State, run: int, tracks: list[Track], waiting: float, now: float, wall: float) -> Stall:
    """What a run shows now: every rank's evidence (the dashboard's view updated to it), how its
    ended ranks ended, what its store said since its ranks began to wait in init_process_group."""
    seen: dict[Who, Evidence] = {t.key: kept.evidence(state, t, now) for t in tracks}
    unformed = _unformed(_store_said(state, seen, tracks))
    for t in tracks:
        if unformed:
            seen[t.key] = kept.evidence(state, t, now, unformed)
        kept.show(state, t, seen[t.key])
    ended_verdict = ended.judge(state, now, wall, run) if any(t.ended for t in tracks) else None
    share = _wait_share(state, seen)
    return Stall(seen, waited=waiting, ended=ended_verdict, store=_store_said(state, seen, tracks),
                 store_coming=_store_coming(state, seen, tracks, now),
                 ends_coming=ended.awaited(state, now),
                 being_read=any(t.held_since_read() and seen[t.key].state is S.UNKNOWN
                                for t in tracks if t.key in seen),
                 placing=waiting < state.config.threshold + stall.RECHECK
                 and any(_left_rendezvous_unseen(t) for t in tracks),
                 planned=state.config.planned,
                 endless=state.config.endless, held_after=state.config.held_after, quiet=_quiet(state, seen, tracks, now),
                 idle_share=share[0] if share else None, idle_span=share[1] if share else None,
                 notes=state.config.notes, find_groups=lambda: meshes.shared_groups(tracks))


def _left_rendezvous_unseen(t: Track) -> bool:
    """It used CPU since its stack showed it in init_process_group, and that is all that says it
    left: a wait there uses some CPU (Gloo's connection retries, a store's polls: 3-9% of a core on
    a loaded box, synchronized across the ranks). Its stack read again says whether it left; the
    verdict waits for it, within RECHECK past the threshold (a bound: then it is said as it is)."""
    return not t.ended and t.idle_since is None and t.dump is not None and t.busy_at is not None \
        and t.stack_at is not None and t.busy_at > t.stack_at \
        and classify(t.dump, None, t.view.wchan, frames=t.frames()).state is S.RENDEZVOUS


def _unformed(store: protocol.StoreAnswer | None) -> str | None:
    """Why the run's world cannot have formed, from its store's answer in this stall: fewer ranks
    checked in than its world size (Gloo: each rank writes its key, then waits for every other
    rank's). No rank leaves init_process_group before every rank of its world has checked in, so
    one seen there is there still. None: nothing says so (a store with no rank's key: NCCL's)."""
    if store is None or store.error or not store.world_size or not store.checked_in \
            or len(set(store.checked_in)) >= store.world_size:
        return None
    return f"its store holds {len(set(store.checked_in))} of {store.world_size} check-ins"


def _wait_share(state: State, seen: dict[Who, Evidence]) -> tuple[float, int] | None:
    """How much of the recent past the ranks that wait in a collective spent idle (a straggler's
    cost), over how many seconds."""
    shares = [sum(c < stall.IDLE_CPU for c in t.view.history[-30:]) / len(t.view.history[-30:])
              for t in state.ranks.values()
              if t.view.history and t.key in seen and seen[t.key].state is S.COLLECTIVE]
    if not shares:
        return None
    return sum(shares) / len(shares), min(30, max(len(t.view.history) for t in state.ranks.values()))


def _quiet(state: State, seen: dict[Who, Evidence], tracks: list[Track], now: float) -> float | None:
    """How long every live rank of the run has been quiet, when every one is on a watched node
    (a rank on a lost node, or one using CPU, may be a straggler)."""
    live = [t for t in tracks if not t.ended and t.key in seen]
    if not live or not all(state.nodes[t.view.node].status is NodeStatus.WATCHING and t.idle_since is not None
                           for t in live):
        return None
    return min(now - t.idle_since for t in live if t.idle_since is not None)


def _store_coming(state: State, seen: dict[Who, Evidence], tracks: list[Track], now: float) -> bool:
    """An agent is reading the store of this run's ranks that wait in init_process_group (its
    answer follows their stacks, within node/store.py's bound)."""
    masters = {t.info.master for t in tracks if t.info is not None and t.key in seen
               and seen[t.key].state is S.RENDEZVOUS}
    return any(now - state.reading[m] < STORE_WAIT for m in masters if m in state.reading)


def _store_said(state: State, seen: dict[Who, Evidence], tracks: list[Track]) -> protocol.StoreAnswer | None:
    """What the store of the ranks that wait in init_process_group said since they began to wait
    (the agents read it with their stacks)."""
    stuck = [t for t in tracks if t.key in seen and seen[t.key].state is S.RENDEZVOUS]
    began = min((t.idle_since for t in stuck if t.idle_since is not None), default=None)
    answers = [state.stores.get(t.info.master if t.info else None) for t in stuck]
    fresh = [said for said, at in filter(None, answers) if began is None or at >= began]
    return fresh[0] if fresh else None


# -- a launcher that waits for nodes that never come -------------------------------------------

def launchers_waiting(state: State, now: float, wall: float, out: list[Effect]) -> None:
    """Torchruns that have started no rank and used no CPU for the threshold, by the store they
    wait at: rendezvous.torchruns_waiting says whether nodes are missing, and which."""
    threshold = state.config.threshold
    waiting = [launcher for launcher in state.launchers.values() if launcher.quiet_since is not None
               and now - launcher.quiet_since >= threshold
               and state.nodes[launcher.node].status is NodeStatus.WATCHING]
    watched = [name for name, n in state.nodes.items() if n.status is NodeStatus.WATCHING]
    for master in sorted({launcher.info.master for launcher in waiting if launcher.info.master}):
        run = [Torchrun(launcher.node, launcher.info.pid, launcher.info.node_rank, launcher.info.nnodes)
               for launcher in state.launchers.values() if launcher.info.master == master]
        quiet = [launcher.quiet_since for launcher in waiting if launcher.info.master == master]
        waited = now - min(q for q in quiet if q is not None)
        found = torchruns_waiting(master, run, watched, waited)
        if found is not None:
            report(state, found, waited, wall, out, Said(About.TORCHRUNS, found.kind, store=master,
                                                         node_ranks=tuple(found.node_ranks)))


# A hang's bundle waits this long at most for the native frames on their way (py-spy takes seconds
# to read libtorch's symbols on a loaded node; a node that never sends them is lost before this).
NATIVE_WAIT = stall.ASK_TIMEOUT

# -- saying it -----------------------------------------------------------------------------------

def report(state: State, found: Diagnosis, waiting: float, wall: float, out: list[Effect], said: Said,
           run: int | None = None) -> None:
    """Say a verdict, once: a hang with a bundle; anything else as a notice. What another run says
    that is no hang (ranks unknown, a straggler) does not take a hang's place in the snapshot."""
    if consequence(state, run):
        return
    bound = bound_passed(state, found, run)
    if bound is not None:
        found, said = bound, Said(About.STALL, bound.kind, tuple(bound.named), run=run)
        waiting = wall - (bound.since if bound.since is not None else wall)
    slow = paused.as_straggler(state, found, run, round(wall - waiting, 3))
    if slow is not None:        # held again at the same line, its steps come between: one straggler notice
        found, said = slow, Said(About.STALL, Kind.STRAGGLER, tuple(slow.named), run=run)
    reported = found.as_reported(round(wall - waiting, 3))
    if found.kind is Kind.HELD or slow is not None:
        state.held.setdefault(run, reported)
    standing = state.diagnosis is not None and state.diagnosis.kind.is_hang and state.diagnosis_run != run
    if found.kind.is_hang or not standing:
        # A hang of a run stands as said (consequence): its wait is the one it was named after. One
        # said again counts on, where its `waited` is how long it has waited (not every rank's quiet).
        goes_on = not (found.kind.is_hang and run is not None) and reported.waited == round(waiting, 1)
        _restate(state, reported, run, wall - waiting if goes_on else None)
    if found.kind.is_hang:
        state.wires_at_hang = {t.key: t.wire for t in state.live() if run is None or t.run == run}
    if said in state.reported:
        return
    state.reported.add(said)
    snap = replace(snapshot(state, wall), diagnosis=reported)
    if found.kind.is_hang:
        out.append(Say(Event(EventKind.DIAGNOSIS, snapshot=snap, verdict=reported)))
        if state.native_due:
            state.bundles_due.append((wall, reported))     # written with the native frames on their way
        else:
            out.append(WriteBundle(snap, details(state)))
    else:
        kind = EventKind.STRAGGLER if found.kind is Kind.STRAGGLER else EventKind.NOTICE
        out.append(Say(Event(kind, snapshot=snap, verdict=reported)))


def _restate(state: State, reported: Diagnosis, run: int | None, began: float | None) -> None:
    """The verdict stands as `reported`. The same one said again, its wait alone longer (a held
    rank, torchruns that wait) or nothing new (a straggler between samples), stays the object it
    was: its `waited` is read at each snapshot from when the wait began (`began`: state.snapshot;
    None where the verdict stands as said, its `waited` with it), and a tick with no new input
    judges it no more (reducer._judged_marks: a verdict that names anew is a move, one said again
    is not). Its figures (a rank's CPU, the idle share) move at samples: each sample is a change
    while it stands (reducer.step)."""
    d, state.restated = state.diagnosis, state.judgements
    if d is None or state.diagnosis_run != run or (replace(reported, waited=d.waited) if began is not None
                                                   else reported) != d:
        d = state.diagnosis = reported
        state.diagnosis_run = run
    if began is not None and d.waited is not None and (state.counting is None or state.counting[0] is not d):
        state.counting = (d, began)


def bound_passed(state: State, found: Diagnosis, run: int | None) -> Diagnosis | None:
    """A rank held the others up (asleep or reading in its own code: Kind.HELD, said of this run)
    and they ended since, before it: their wait had a bound (their process group's timeout:
    "Timed out"), and it passed while the rank was still held. That is the hang, certain: its
    rank, line and function; the others' ends are its consequence. None otherwise."""
    held = state.held.get(run)
    if found.kind is not Kind.EXITED or held is None:
        return None
    gone = [t for t in state.ranks.values() if t.ended and t.gone_at is not None and (run is None or t.run == run)]
    if not gone:
        return None
    first = [t for t in gone if t.gone_at == min(t.gone_at for t in gone if t.gone_at is not None)]
    if any(t.key in held.culprits or not _timed_out(t) for t in first):
        return None          # the held rank ended first, or one ended for a cause of its own (a stop, a kill)

    return replace(held, kind=Kind.DEADLOCK, certainty=Certainty.CERTAIN, bound=None, every=None)


def _timed_out(t: Track) -> bool:
    """Its own exception is a collective's timeout, as the one catalogue names it (Part.TIMEOUT)."""
    e = t.exception
    return e is not None and any(f.message.part is Part.TIMEOUT for f in failures.find(f"{e.type}: {e.message}"))


def bundle_when_complete(state: State, wall: float, out: list[Effect]) -> None:
    """A hang named from Python frames while native frames were still coming (a stall's staged
    answer: the reducer's wait in C++ under backward(), a recv's native frames) is said at once;
    its bundle is written once they have come, or a lost node will send none, or NATIVE_WAIT has
    passed: the bundle keeps the stacks the verdict stands on and the native frames behind them."""
    for due in list(state.bundles_due):
        named_at, reported = due
        if state.native_due and wall - named_at < NATIVE_WAIT:
            continue
        state.bundles_due.remove(due)
        out.append(WriteBundle(replace(snapshot(state, wall), diagnosis=reported), details(state)))


def consequence(state: State, run: int | None) -> bool:
    """A hang stands named for this run: whatever it shows next (victims' timeouts and exits, lost
    peers, torchrun's stop of the others, ddp-preflight's own freeze and stop) is that hang's
    consequence, never a verdict of its own: no new culprit, no second bundle, and the verdict
    said stays the run's. Decided by what was said (the state), not by a time window; only
    progress resuming ends it (resumed)."""
    d = state.diagnosis
    return run is not None and d is not None and d.kind.is_hang and state.diagnosis_run == run


def stopped_by_us(state: State) -> bool:
    """ddp-preflight has begun stopping every node (it freezes the ranks with SIGSTOP, then stops
    them): what the ranks show from then on is its own doing."""
    return any(node is None for node, _, _ in state.launcher_stops)


def ends_said(found: Diagnosis) -> Said:
    """What a verdict on ended ranks is said once for: its kind, its named ranks' processes (a
    later run's ranks are other processes)."""
    pids = tuple(sorted(e.pid for e in found.evidence if e.key in found.named and e.pid is not None))
    return Said(About.ENDS, found.kind, tuple(found.named), pids=pids)


def resumed(state: State, out: list[Effect]) -> None:
    """Every rank makes progress again: a hang said is over (an exit or 'alone' stands). Not while
    ddp-preflight stops the run (its frozen ranks, let go to be stopped, use CPU), nor once a rank
    of the hang's run has ended since (a run that lost a rank does not resume)."""
    run = state.diagnosis_run
    if stopped_by_us(state) or state.stopping or \
            any(t.ended and (run is None or t.run == run) for t in state.ranks.values()):
        return
    d = state.diagnosis
    if d is not None and d.kind.is_hang and \
            any(t.wire is not None and t.wire <= state.wires_at_hang.get(t.key, t.wire)
                for t in state.live() if run is None or t.run == run):
        return       # CPU alone (every rank raising its collective's timeout at once) is no resumed training
    paused.went_on(state)
    state.held.clear()
    if state.diagnosis is not None and state.diagnosis.kind not in (Kind.EXITED, Kind.ALONE):
        state.diagnosis = None
        state.reported = {said for said in state.reported if said.stands}
        remember(state, "progress resumed")
        out.append(say(EventKind.RESUMED, "progress resumed: no rank is idle"))


__all__ = ["stalled", "report", "resumed", "ends_said", "launchers_waiting"]
