"""Each rank's evidence from what the watcher holds, and what the ranks together say once progress
has stopped (diagnose.py), a run has ended (exits.py via ended.py), a straggler never arrives
(endless), stacks cannot be read (stall), ranks wait in init_process_group (who never checked in),
or no rank ever connects (alone); and the saying of it, once, with a bundle for a hang."""

from __future__ import annotations

from dataclasses import replace

from node import protocol
from node.store import READ_TIMEOUT

from . import ended, stall, text
from .causes import CAUSES
from .classify import BUSY_CPU, RankState, classify, frames_of
from .diagnose import connected_late, diagnose, rendezvous_stall, trains_alone, verdict, working
from .inputs import Say, WriteBundle
from .model import Certainty, Diagnosis, Event, Evidence, Kind, NodeStatus, RankStatus, Reason
from .state import State, Track, details, remember, say, snapshot

S = RankStatus
ALONE_AFTER = 30.0        # seconds every rank works with no connection before "each rank trains alone"
STORE_WAIT = READ_TIMEOUT + 2.0   # seconds a store being read is waited for (the read's bound, and the way back)
GONE = "is gone"


# -- one rank --------------------------------------------------------------------------------------

def evidence_of(state: State, t: Track, now: float) -> Evidence:
    """One rank as its stack, its CPU and its helpers', its kernel state, its Flight Recorder and
    its sockets show it; its view is updated to match."""
    v = t.view
    if t.ended:
        return Evidence(v.node, v.pid, _rank(t), S.EXITED, exit=v.exit, ended_at=t.exit_t, frame=v.frame,
                        function=v.function, exception=t.exception, quote=t.quote, **_flight(t))
    if state.nodes[v.node].status in (NodeStatus.LOST, NodeStatus.ERROR):
        # Its stack and CPU are from before the node was lost: they say nothing now.
        v.state, v.op, v.frame, v.function = S.UNKNOWN, None, None, None
        return Evidence(v.node, v.pid, _rank(t), S.UNKNOWN,
                        notes=(f"not watched: {v.node}'s agent {state.lost.get(v.node, GONE)}",))
    found = classify(t.dump, v.cpu, v.wchan)
    if found.state in (S.COLLECTIVE, S.RENDEZVOUS, S.IDLE, S.GPU_WAIT) and t.idle_since is None and \
            t.busy_at is not None and t.stack_at is not None and t.busy_at > t.stack_at:
        # It has used CPU since its stack showed it waiting: the stack no longer says where.
        found = RankState(S.COMPUTING if v.cpu >= BUSY_CPU else S.RUNNING,
                          evidence=(f"CPU {v.cpu:.0f}%", "working since its last stack"))
    notes = list(found.evidence)
    if t.dump is None and t.dump_error:
        notes = [f"no stack: {t.dump_error}"]
    state_, reason = found.state, found.reason
    if t.stopped:
        state_, reason = S.STOPPED, Reason.STOPPED
        notes.append("the kernel holds it: state " + ("T (stopped)" if t.proc_state == "T" else "t (traced)"))
    elif t.idle_since is not None and state_ in (S.LOADING_DATA, S.SAVING):
        # Quiet (neither it nor its helpers use CPU), in a phase that works through helpers or I/O:
        # its own bytes say whether it still progresses (a loader's workers, a slow disk).
        if (t.io_known and t.moved == 0) or (not t.io_known and state_ is S.LOADING_DATA):
            reason = Reason.WAITS_FOR_DATA if state_ is S.LOADING_DATA else Reason.WAITS_ON_IO
            notes.append(f"its helpers used {t.children_cpu or 0:.0f}% CPU" if t.children_cpu is not None
                         else "it has no helper processes")
    elif state_ is S.IDLE and t.proc_state == "D":
        reason = Reason.WAITS_ON_IO
        notes.append("in the kernel's uninterruptible wait (state D)")
    if t.spinning:
        notes.append("its stacks show it waiting at one place, unchanged, while its host thread spins")
    if t.idle_since is not None and t.io_known:
        notes.append(f"{t.moved} B read or written since it stopped")
    if t.sockets is not None and t.sockets.unsent:
        notes.append(f"{t.sockets.unsent} B sent and not acknowledged by its peers")
    v.state, v.op = state_, found.op
    v.frame = found.frame.where if found.frame else None
    v.function = found.frame.function if found.frame else None
    v.stack = [{"function": f.function, "file": f.file, "line": f.line} for f in frames_of(t.dump)] if t.dump else None
    return Evidence(v.node, v.pid, _rank(t), state_, reason, found.op, v.frame, v.function,
                    moved=t.moved if t.io_known and t.idle_since is not None else None,
                    unsent=t.sockets.unsent if t.sockets is not None else None, notes=tuple(notes), **_flight(t))


def _rank(t: Track) -> int | None:
    return t.view.rank if not t.duplicate else None


def _flight(t: Track) -> dict:
    """Its last collective, from its Flight Recorder (the default process group's)."""
    groups = (t.view.flight or {}).get("groups") or []
    main = next((g for g in groups if g.get("group") == "default_pg"), groups[0] if groups else None)
    if main is None:
        return {}
    return {"seq": main.get("seq"), "seq_op": main.get("op"), "completed": main.get("completed")}


# -- when progress has stopped -----------------------------------------------------------------

def stalled(state: State, waiting: float, now: float, wall: float, out: list, run: int | None = None) -> None:
    """Progress stopped `waiting` seconds ago in `run` (None: every run with a quiet rank) and the
    stacks in hand show where every quiet rank of it is. Each run is judged alone: another run's
    ranks (another user's, another store's) are neither culprits nor victims of its verdict."""
    if run is None:
        for each in sorted({t.run for t in state.live() if t.idle_since is not None}):
            stalled(state, waiting, now, wall, out, each)
        return
    tracks = [t for t in state.ranks.values() if t.run == run]
    ended_verdict = None
    if any(t.ended for t in tracks):
        ended_verdict = ended.judge(state, now, wall, run)
        if ended_verdict is None and any(t.ended and t.exit_status is not None and t.exit_status.stopped
                                         for t in tracks):
            return      # someone is stopping the run (Ctrl-C, a scheduler, a launcher): not a hang to name
    seen = {t.key: evidence_of(state, t, now) for t in tracks}
    found = diagnose(seen, ended_verdict)
    found = _without_stacks(state, found, seen, now, tracks) or found
    if _store_coming(state, seen, tracks, now):
        return      # its store's answer is on its way (read under a short deadline): judged with it
    found = _rendezvous(state, found, seen, tracks) or found
    if found.kind is Kind.NONE:
        return
    if found.kind is Kind.STRAGGLER and waiting >= state.config.endless:
        found = _endless(state, found, seen, waiting) or found
    if found.kind is Kind.STRAGGLER:
        found = _with_wait_share(state, found, seen)
    elif found.kind is Kind.GPU_HANG:
        found = verdict(**{**_fields(found), "waited": round(waiting, 1)})
    found = replace(found, notes=_notes(state, [t for t in tracks if t.key in found.named]))
    report(state, replace(found, summary=text.summary(found)), waiting, wall, out,
           key=f"{found.kind.value}:{found.named}:runs {[run]}", run=run)


def _fields(d: Diagnosis) -> dict:
    return {name: getattr(d, name) for name in d.__dataclass_fields__ if name != "summary"}


def _endless(state: State, found: Diagnosis, seen: dict[int, Evidence], waiting: float) -> Diagnosis | None:
    """A straggler that never arrives: its peers have waited `endless` seconds while it computes.
    Compiling, saving and loading data may take that long and arrive: only computing counts."""
    busy = {k: e for k, e in seen.items() if k in found.culprits}
    if not busy or any(e.state not in (S.COMPUTING, S.RUNNING) for e in busy.values()):
        return None
    return verdict(kind=Kind.ENDLESS, culprits=found.culprits, reason=Reason.COMPUTES_FOREVER,
                   certainty=Certainty.LIKELY, evidence=found.evidence, waited=round(waiting, 1),
                   bound=state.config.endless, causes=CAUSES[Reason.COMPUTES_FOREVER])


def _notes(state: State, tracks: list[Track]) -> tuple[str, ...]:
    """What preflight said of these ranks' nodes (under --launch): the data-shards warning of the
    node whose loader never ends is the clue."""
    return tuple(f"{node}: {note}" for node in dict.fromkeys(t.view.node for t in tracks)
                 for note in state.config.notes.get(node, ()))


def _with_wait_share(state: State, found: Diagnosis, seen: dict[int, Evidence]) -> Diagnosis:
    """How much of the recent past the waiting ranks spent idle: the straggler's cost."""
    shares = [sum(c < stall.IDLE_CPU for c in t.view.history[-30:]) / len(t.view.history[-30:])
              for t in state.ranks.values()
              if t.view.history and t.key in seen and seen[t.key].state is S.COLLECTIVE]
    if not shares:
        return found
    span = min(30, max(len(t.view.history) for t in state.ranks.values()))
    return verdict(**{**_fields(found), "idle_share": sum(shares) / len(shares), "idle_span": span})


def _without_stacks(state: State, found: Diagnosis, seen: dict[int, Evidence], now: float,
                    tracks: list[Track]) -> Diagnosis | None:
    """Stacks missing for some rank (no ptrace, no py-spy), yet every rank is watched and none has
    used CPU: the run is stalled, though who is guilty cannot be told. A rank on a lost node, or
    one using CPU, may be a straggler: then it stays `unseen`, not a hang."""
    unknown = [k for k, e in seen.items() if e.state is S.UNKNOWN]
    if not unknown or found.kind not in (Kind.NONE, Kind.UNSEEN):
        return None
    live = [t for t in tracks if not t.ended and t.key in seen]
    if not live or not all(state.nodes[t.view.node].status is NodeStatus.WATCHING and t.idle_since is not None
                           for t in live):
        return None
    quiet = min(now - t.idle_since for t in live if t.idle_since is not None)
    return verdict(kind=Kind.STALL, evidence=found.evidence, certainty=Certainty.UNSURE, waited=quiet,
                   unknown_why="stacks are unavailable")


def _store_coming(state: State, seen: dict[int, Evidence], tracks: list[Track], now: float) -> bool:
    """An agent is reading the store of this run's ranks that wait in init_process_group (its
    answer follows their stacks, within node/store.py's bound)."""
    masters = {t.info.master for t in tracks if t.info is not None and t.key in seen
               and seen[t.key].state is S.RENDEZVOUS}
    return any(now - state.reading[m] < STORE_WAIT for m in masters if m in state.reading)


def _rendezvous(state: State, found: Diagnosis, seen: dict[int, Evidence], tracks: list[Track]) -> Diagnosis | None:
    """Ranks wait in init_process_group: what their store said since they began to wait (the
    agents read it with their stacks) names who never checked in, and the node it belongs to."""
    if found.kind not in (Kind.RENDEZVOUS_STALL, Kind.NONE):
        return None
    stuck = [t for t in tracks if t.key in seen and seen[t.key].state is S.RENDEZVOUS]
    began = min((t.idle_since for t in stuck if t.idle_since is not None), default=None)
    answers = [state.stores.get(t.info.master if t.info else None) for t in stuck]
    fresh = [said for said, at in filter(None, answers) if began is None or at >= began]
    return rendezvous_stall(seen, fresh[0] if fresh else None, state.config.planned)


# -- a launcher that waits for nodes that never come -------------------------------------------

def launchers_waiting(state: State, now: float, wall: float, out: list) -> None:
    """A torchrun that has started no rank and used no CPU for the threshold waits in its rendezvous
    for the other nodes' torchruns: the node ranks that never checked in are the ones no watched
    node runs (each torchrun's command line says its node rank and the run's number of nodes), and
    a watched node that runs no torchrun of the run is where they were to be."""
    threshold = state.config.threshold
    waiting = [launcher for launcher in state.launchers.values() if launcher.quiet_since is not None
               and now - launcher.quiet_since >= threshold
               and state.nodes[launcher.node].status is NodeStatus.WATCHING]
    for master in sorted({launcher.info.master for launcher in waiting if launcher.info.master}):
        run = [launcher for launcher in state.launchers.values() if launcher.info.master == master]
        nnodes = max((launcher.info.nnodes or 0 for launcher in run), default=0)
        present = {launcher.info.node_rank for launcher in run if launcher.info.node_rank is not None}
        missing = sorted(set(range(nnodes)) - present)
        if not nnodes or not missing:
            continue
        hosts = {launcher.node for launcher in run}
        absent = [name for name, n in state.nodes.items() if n.status is NodeStatus.WATCHING and name not in hosts]
        named = tuple(absent) if len(absent) == len(missing) else ()
        evidence = tuple(Evidence(launcher.node, launcher.info.pid, None, S.RENDEZVOUS, notes=(
            f"torchrun, node rank {launcher.info.node_rank} of {nnodes}",)) for launcher in run)
        quiet = [launcher.quiet_since for launcher in waiting if launcher.info.master == master]
        waited = now - min(q for q in quiet if q is not None)
        found = verdict(kind=Kind.RENDEZVOUS_STALL, reason=Reason.NEVER_CHECKED_IN,
                        certainty=Certainty.LIKELY if named else Certainty.UNSURE, evidence=evidence, nodes=named,
                        node_ranks=tuple(missing), store=master, world=nnodes, waited=round(waited, 1),
                        causes=CAUSES[Reason.NEVER_CHECKED_IN][1:] + (
                            "it cannot reach the store: ddp-preflight's master-reachable",))
        report(state, found, waited, wall, out, key=f"launchers:{master}:{missing}")


# -- saying it -----------------------------------------------------------------------------------

def report(state: State, found: Diagnosis, waiting: float, wall: float, out: list, key: str | None = None,
           run: int | None = None) -> None:
    """Say a verdict, once: a hang with a bundle; anything else as a notice. What another run says
    that is no hang (ranks unknown, a straggler) does not take a hang's place in the snapshot."""
    reported = found.as_reported(round(wall - waiting, 3))
    standing = state.diagnosis is not None and state.diagnosis.kind.is_hang and state.diagnosis_run != run
    if found.kind.is_hang or not standing:
        state.diagnosis, state.diagnosis_run = reported, run
    said = key or f"{found.kind.value}:{found.named}"     # said once: per run, per kind, per ranks named
    if said in state.reported:
        return
    state.reported.add(said)
    snap = replace(snapshot(state, wall), diagnosis=reported)
    if found.kind.is_hang:
        out.append(Say(Event("diagnosis", f"{found.kind.value.upper()}: {found.summary}", snap)))
        out.append(WriteBundle(snap, details(state)))
    else:
        out.append(Say(Event("straggler" if found.kind is Kind.STRAGGLER else "notice", found.summary, snap)))


def resumed(state: State, out: list) -> None:
    """Every rank makes progress again: a hang said is over (an exit or 'alone' stands)."""
    if state.diagnosis is not None and state.diagnosis.kind not in (Kind.EXITED, Kind.ALONE):
        state.diagnosis = None
        state.reported = {k for k in state.reported if k.startswith((Kind.EXITED.value, Kind.ALONE.value, "launchers"))}
        remember(state, "progress resumed")
        out.append(say("resumed", "progress resumed: no rank is idle"))


# -- ranks that never talk -------------------------------------------------------------------

def connections(state: State, node: str, msg: protocol.Sample, now: float, wall: float, out: list) -> None:
    """Each rank's TCP connections, counted every few samples: a rank with none at all has
    joined no process group (its store and its peers are connections)."""
    counted = False
    for s in msg.ranks:
        t = state.ranks.get((node, s.pid))
        if t is None or s.tcp is None:
            continue
        counted = True
        if s.tcp:
            t.talked, t.alone_since = True, None
        elif t.alone_since is None and not t.talked:
            t.alone_since = now
    if counted:
        _alone(state, now, wall, out)


def _alone(state: State, now: float, wall: float, out: list) -> None:
    """Said once, not as a hang (nothing stops the run): every rank of a world of more than one
    has worked for ALONE_AFTER without a single connection. Taken back if one connects later
    (a process group created late)."""
    if state.alone:
        late = [t for key in state.alone if (t := state.ranks.get(key)) is not None and t.talked]
        if late:
            state.alone = ()
            if state.diagnosis is not None and state.diagnosis.kind is Kind.ALONE:
                state.diagnosis = None
            said = connected_late(sorted(t.key for t in late))
            remember(state, said)
            out.append(say("notice", said, alone=False))
        return
    live = state.live()
    world = [t for t in live if (t.view.world_size or 0) > 1]
    if not world or len(world) < len(live) or \
            any(state.nodes[t.view.node].status is not NodeStatus.WATCHING for t in world):
        return
    alone = [t for t in world if t.alone_since is not None and now - t.alone_since >= ALONE_AFTER
             and t.busy_at is not None and t.busy_at >= t.alone_since]
    if len(alone) < len(world):
        return
    seconds = min(now - t.alone_since for t in alone if t.alone_since is not None)
    found = trains_alone([replace(evidence_of(state, t, now), notes=(
        f"no TCP connection for {now - (t.alone_since or now):.0f} s", f"CPU {t.view.cpu:.0f}%")) for t in alone],
        max(t.view.world_size or 0 for t in alone), seconds)
    state.alone = tuple((t.view.node, t.view.pid) for t in alone)
    if state.diagnosis is None:
        state.diagnosis = found.as_reported(round(wall - seconds, 3))
    remember(state, found.summary)
    out.append(Say(Event("notice", found.summary, snapshot(state, wall), {"alone": True})))


__all__ = ["ALONE_AFTER", "evidence_of", "stalled", "report", "resumed", "connections", "working"]
