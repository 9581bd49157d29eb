"""One rank as the verdicts read it (model.Evidence), from what the watcher holds of it: its stack,
its CPU and its helpers', its kernel state, its Flight Recorder, its sockets, how it ended. Pure:
it reads the state and changes nothing (`shown` is what updates the dashboard's view from it, where
the reducer chooses to). Used by the stall's verdict (verdicts.py), the judging of ends (ended.py)
and the ranks that never connect."""

from __future__ import annotations

from .classify import BUSY_CPU, RankState, classify
from .model import Evidence, InGroup, NodeStatus, RankStatus, Reason
from .state import GONE, State, Track

S = RankStatus


def evidence_of(state: State, t: Track, now: float, unformed: str | None = None) -> Evidence:
    """One rank as its stack, its CPU and its helpers', its kernel state, its Flight Recorder and
    its sockets show it now. unformed: why its world cannot have formed (its store holds fewer
    check-ins than its world size): a rank its stack showed in init_process_group is still there,
    whatever CPU its wait uses (3-9% of a core on a loaded box: a store's polls)."""
    v = t.view
    if t.ended:
        return Evidence(v.node, v.pid, _rank(t), S.EXITED, exit=v.exit, ended_at=t.exit_t, frame=v.frame,
                        function=v.function, exception=t.exception, quote=t.quote, **_flight(t))
    if state.nodes[v.node].status in (NodeStatus.LOST, NodeStatus.ERROR):
        # Its stack and CPU are from before the node was lost: they say nothing now.
        lost = f"not watched: {v.node}'s agent {state.lost.get(v.node, GONE)}"
        return Evidence(v.node, v.pid, _rank(t), S.UNKNOWN, notes=(lost,), unseen=lost)
    found = classify(t.dump, v.cpu, v.wchan, waits_in=v.waits_in, frames=t.frames())
    stale = _stale(t, found, state.config.interval) if not (unformed and found.state is S.RENDEZVOUS) else None
    if t.idle_since is None and t.dump is not None and t.held_since_read():
        # Working at its last sample of its own, held by our py-spy since (reading its stack): that
        # CPU is from before, so neither it nor a stack read with it says what the rank does now.
        held = "held by hangwatch's py-spy since its stack was read: its CPU is not its own meanwhile"
        found = RankState(S.UNKNOWN, evidence=(held,), unseen=held)
    elif stale is not None:
        # Not quiet, and its stack no longer says where it is: it works, somewhere.
        found = RankState(S.COMPUTING if v.cpu >= BUSY_CPU else S.RUNNING, evidence=(f"CPU {v.cpu:.0f}%", stale))
    notes = list(found.evidence)
    if unformed and found.state is S.RENDEZVOUS and _stale(t, found, state.config.interval) is not None:
        notes.append(f"used CPU since its stack, and cannot have left: {unformed}")
    unseen = found.unseen
    if t.dump is None and t.dump_error:
        unseen = f"no stack: {t.dump_error}"
        notes = [unseen]
    state_, reason = found.state, found.reason
    if t.stopped:
        state_, reason = S.STOPPED, Reason.STOPPED
        notes.append("the kernel holds it: state " + ("T (stopped)" if t.proc_state == "T" else "t (traced)"))
    elif t.idle_since is not None and state_ in (S.LOADING_DATA, S.SAVING, S.IMPORTING):
        # Quiet (neither it nor its helpers use CPU), in a phase that works through helpers or I/O:
        # its own bytes say whether it still progresses (a loader's workers, a slow disk, an import
        # from a file system that does not answer).
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
    return Evidence(v.node, v.pid, _rank(t), state_, reason, found.op, found.frame.where if found.frame else None,
                    found.frame.function if found.frame else None,
                    moved=t.moved if t.io_known and t.idle_since is not None else None,
                    unsent=t.sockets.unsent if t.sockets is not None else None, notes=tuple(notes),
                    unseen=unseen if state_ is S.UNKNOWN else None, **_flight(t))


def _stale(t: Track, found: RankState, interval: float) -> str | None:
    """Why the stack in hand no longer says where a rank that is not quiet is: it has used CPU
    since that stack showed it waiting (in a sample that began after the stack came: a sample
    that came after the stack was asked for, but began before it was read, counts CPU the rank
    used before it entered its wait, or while our py-spy stopped and released it); or a newer
    stack of it is on its way (its Python frames came, their native ones follow) and the one in
    hand (its start-up's, importing torch) says where it was. None: it still says."""
    if t.idle_since is not None or t.dump is None:
        return None
    if found.state in (S.COLLECTIVE, S.RENDEZVOUS, S.IDLE, S.GPU_WAIT) and t.busy_at is not None and \
            t.stack_at is not None and t.busy_at > t.stack_at and \
            t.busy_at - interval >= max(t.stack_at, t.read_at if t.read_at is not None else t.stack_at):
        return "working since its last stack"
    if t.withheld is not None and (t.stack_at is None or t.stack_at < t.withheld.taken):
        return "its newer stack is on its way"
    return None


def shown(state: State, t: Track, e: Evidence) -> None:
    """The dashboard's view of a live rank, as its evidence shows it: where it is, and its stack
    (a lost node's ranks keep the stack they had, marked unknown)."""
    if t.ended:
        return
    v = t.view
    v.state, v.op, v.frame, v.function = e.state, e.op, e.frame, e.function
    if state.nodes[v.node].status not in (NodeStatus.LOST, NodeStatus.ERROR):
        v.stack = [{"function": f.function, "file": f.file, "line": f.line} for f in t.frames()] \
            if t.dump else None


def _rank(t: Track) -> int | None:
    return t.view.rank if not t.duplicate else None


def _flight(t: Track) -> dict:
    """Its last collective, from its Flight Recorder: the default process group's (`seq`), and
    where it is in each group it has used (`groups`: sequence numbers count per group)."""
    groups = [g for g in (t.view.flight or {}).get("groups") or [] if isinstance(g, dict)]
    if not groups:
        return {}
    # A summary from before groups had ids holds one group: taken as the default one. Never another
    # group's numbers for the default group's: they count apart.
    old = groups[0] if len(groups) == 1 and "id" not in groups[0] else {}
    main = next((g for g in groups if is_default(g)), old)
    return {"seq": main.get("seq"), "seq_op": main.get("op"), "completed": main.get("completed"),
            "groups": tuple(InGroup(str(g.get("id") or g.get("group")), g["seq"], g.get("op"), g.get("completed"),
                                    bool(g.get("last")), tuple(g.get("ranks") or ()))
                            for g in groups if isinstance(g.get("seq"), int))}


def is_default(group: dict) -> bool:
    """The default (world) process group: torch names it "0" and describes it "default_pg"."""
    return group.get("group") == "default_pg" or group.get("id") == "0"
