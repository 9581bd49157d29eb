"""How each rank ended, gathered from every source as it comes (its agent: the exit the moment it
happens, its code, its own record, its output file, its node's OOM count; under `--launch` the
launcher: torchrun's exit code, the exceptions in its output, when a launcher began stopping
ranks), and when the ends of a run are judged (exits.judge: which ending no other explains).

Times are put on the master's clock. Each node's clock is read as NTP does: the watcher sends its
clock, the agent answers with its own, and the node's offset is its answer minus the midpoint of
the round trip, to within half the round trip (the best reading is kept): that half is each
ending's margin. Without a reading (an older agent), the least gap between a sample's arrival
and its stamp gives the offset, when the clocks are more than CLOCK_STEP apart."""

from __future__ import annotations

from dataclasses import asdict, replace

from ddp_preflight.node import protocol
from ddp_preflight.node.protocol import ExitStatus

from . import exits, named, notes
from .events import EventKind
from .evidence import evidence_of
from .exits import Ending
from .inputs import Effect, LauncherStopping, RankEnded, RankError
from .model import Diagnosis, Evidence, NodeStatus, RankStatus, RankView, Seen, Who
from .state import State, Track, say
from .tracebacks import ExceptionInfo, ExceptionKind, exception_in, from_record, own_code, short_name

S = RankStatus
EXIT_WAIT = 10.0     # s: the most a run's ends wait for an agent's exit message of a rank it saw go: a bound,
                     # not a judgement (a live agent sends it within its 200 ms pidfd poll and a read of the
                     # rank's record; one that could not open the pidfd never does; a lost agent is not waited for)
CLOCK_STEP = 0.1     # s: nodes' clocks this close (NTP keeps them within ms) are taken as one clock


def rank_exit(state: State, t: Track, msg: protocol.RankExit, now: float, out: list[Effect]) -> None:
    """The agent saw the exit the moment it happened (pidfd), with what the node could tell of it."""
    fresh = not t.ended
    t.exit_heard = True
    status = ExitStatus.from_wait_status(msg.code) if msg.code is not None else None
    if fresh or t.exit_status is None:
        _ended(state, t, status if status is not None else t.exit_status, msg.t, now)
    t.oom = msg.oom if msg.oom is not None else t.oom
    if isinstance(msg.ending, dict):
        t.ending = msg.ending
        recorded = msg.ending.get("t")
        if isinstance(recorded, (int, float)):
            t.exit_t = on_one_clock(state, t.view.node, float(recorded))   # when it left, before its teardown
        raised = from_record(msg.ending)
        if raised is not None:                # its own word on its exception, over what its output showed
            t.exception, t.quote = as_seen(raised, "record"), None
    if msg.output and t.exception is None:
        seen = exception_in(msg.output)
        if seen is not None:
            t.exception, t.quote = as_seen(seen, "output"), seen.quote[0] if seen.quote else None
    for pid, closed in (msg.closed or {}).items():
        other = state.ranks.get((t.view.node, pid))
        if other is not None and not other.ended and other.leaving is None:
            # At the first end beside it: had it closed connections of its own (on its way out)?
            other.leaving = closed > 0
    if fresh:
        _gone(state, t, out)


def awaited(state: State, now: float) -> bool:
    """A rank its agent found, then saw gone (or a zombie), whose exit message has not come: every
    rank an agent found ends in one (node/agent.py), with its code and its own record of how its
    script ended, but on a loaded node seconds after the sample that missed the rank. A run's ends
    are judged with it: without it a rank that finished cleanly first reads as one that may have
    failed (CI: "ended first (exit code 0) ... its own error or a lost peer"). Waited for while its
    node is watched, EXIT_WAIT at most. A rank only its launcher saw (it ended before the agent's
    first sample) has no exit message to wait for."""
    return any(t.ended and t.info is not None and not t.exit_heard and t.gone_at is not None
               and now - t.gone_at < EXIT_WAIT
               and state.nodes[t.view.node].status is NodeStatus.WATCHING for t in state.ranks.values())


def zombie(state: State, t: Track, status: ExitStatus, at: float | None, now: float, out: list[Effect]) -> None:
    """A sample caught it as a zombie, before its exit notice."""
    _ended(state, t, status, at, now)
    _gone(state, t, out)


def vanished(state: State, t: Track, at: float | None, now: float, out: list[Effect]) -> None:
    """It is gone, its code collected by its parent before anyone read it."""
    _ended(state, t, None, at, now)
    _gone(state, t, out)


def _ended(state: State, t: Track, status: ExitStatus | None, at: float | None, now: float) -> None:
    v = t.view
    if status is not None:
        v.exit = status             # None stays None: its parent collected the code before anyone read it
    v.state, v.cpu, t.idle_since, v.idle_for = S.EXITED, 0.0, None, 0.0
    if t.stack_at is None or (t.busy_at is not None and t.busy_at > t.stack_at):
        # Its stack is older than its last work (often its startup's: the import line): it says
        # nothing of where it ended, and is never shown as that.
        v.frame = v.function = v.op = None
        v.stack, t.dump = None, None
    if t.gone_at is None:
        t.gone_at, t.exit_t = now, on_one_clock(state, v.node, at)
    t.exit_status = status if status is not None else t.exit_status
    state.exit_check_at = now + state.config.settle


def _gone(state: State, t: Track, out: list[Effect]) -> None:
    v = t.view
    how = str(v.exit) if v.exit is not None else "exited (its parent collected the exit code)"
    out.append(say(EventKind.RANK_GONE, f"{v.node}: {v.label} {how}", node=v.node, pid=v.pid, rank=v.rank,
                   exit=asdict(v.exit) if v.exit is not None else None))


def as_seen(info: ExceptionInfo, source: str) -> Seen:
    where = f"{info.file}:{info.line}" if info.file and info.line else None
    return Seen(info.type, info.message, where, info.function, info.lost_peer, info.peer, source, info.cause,
                info.failure)


# -- what the launcher says ----------------------------------------------------------------------

def launcher_stopping(state: State, event: LauncherStopping, wall: float) -> None:
    at = event.t if event.node is None else on_one_clock(state, event.node, event.t)
    state.launcher_stops.append((event.node, at if at is not None else wall, event.by))


def rank_error(state: State, event: RankError) -> None:
    t = _launched(state, event.node, event.rank, None)
    if t is not None:
        t.exception = as_seen(event.exception, "output")
        t.quote = event.exception.quote[0] if event.exception.quote else None
        t.logged = event.exception.kind is ExceptionKind.LOGGED


def went_on(state: State, node: str, rank: int) -> None:
    """A launched rank printed a step after an error it only logged (NCCL's watchdog line): it went
    on, so that line was not its end; how it ends is read from what comes next."""
    t = _launched(state, node, rank, None)
    if t is not None and t.logged and not t.ended:
        t.exception, t.quote, t.logged = None, None, False


def rank_ended(state: State, event: RankEnded, now: float, out: list[Effect]) -> None:
    """torchrun's word on a rank's end (its real exit code), where the agent could not read it, or
    never saw the rank at all (it ended before its first sample)."""
    t = _launched(state, event.node, event.rank, event.pid)
    if t is None:
        if event.pid is None:
            return
        view = RankView(node=event.node, pid=event.pid, rank=event.rank)
        t = state.ranks[(event.node, event.pid)] = Track(view, run=_latest_run(state))
    if t.exit_status is None or not t.ended:
        fresh = not t.ended
        _ended(state, t, event.status, None, now)
        if fresh:
            _gone(state, t, out)


def _launched(state: State, node: str, rank: int, pid: int | None) -> Track | None:
    """The track of a launched rank: by pid when known, else the latest with that rank on that node."""
    if pid is not None and (node, pid) in state.ranks:
        return state.ranks[(node, pid)]
    found = [t for t in state.tracks(node) if t.view.rank == rank]
    return max(found, key=lambda t: t.run) if found else None


def _latest_run(state: State) -> int:
    return max((t.run for t in state.ranks.values()), default=state.runs)


# -- judging the ends of a run -------------------------------------------------------------------

def clocks_apart(state: State) -> float:
    """How far apart the nodes' clocks are: from the readings of each node's clock where every node
    was read, else from the agents' stamps (each node's least master's wall - its stamp: its offset
    plus its quickest delivery)."""
    if len(state.clocks) > 1 and all(node in state.clocks for node in state.clock_gap):
        offsets = [offset for _, offset in state.clocks.values()]
        return max(offsets) - min(offsets)
    gaps = state.clock_gap.values()
    return max(gaps) - min(gaps) if len(state.clock_gap) > 1 else 0.0


def on_one_clock(state: State, node: str, at: float | None) -> float | None:
    """A node's time stamp on the master's clock: the order of exits on different nodes is then
    the order they happened in, within each node's margin."""
    if at is None:
        return None
    if node in state.clocks:
        return at - state.clocks[node][1]
    if node not in state.clock_gap or clocks_apart(state) <= CLOCK_STEP:
        return at
    return at + state.clock_gap[node]


def margin(state: State, node: str) -> float:
    """How far a stamp of this node may be off the master's clock once put on it: half the round trip
    of its best clock reading; without one, the nodes' spread when they are taken as one clock, else
    CLOCK_STEP."""
    if node in state.clocks:
        return max(state.clocks[node][0] / 2, 0.001)
    apart = clocks_apart(state)
    return max(apart, 0.001) if apart <= CLOCK_STEP else CLOCK_STEP


def ending_of(state: State, t: Track, closed: dict[Who, tuple[frozenset, frozenset]] | None = None,
              owner: dict[str, Who] | None = None) -> Ending:
    stopped_by = _stopped_by(state, t)
    first, on = (closed or {}).get(t.key, (frozenset(), frozenset()))
    peer = t.exception.peer if t.exception is not None and t.exception.lost_peer else None
    frame, function = crashed_at(t.ending)
    return Ending(t.view.node, t.view.pid, t.view.rank if not t.duplicate else None, t.exit_t, margin(state, t.view.node),
                  t.exit_status, t.ending, t.exception, t.quote, t.oom, stopped_by, t.launcher,
                  frame, function, t.leaving, first, on,
                  frozenset(o.key for o in _peers(state, t)), (owner or {}).get(peer) if peer else None)


def crashed_at(record: dict | None) -> tuple[str | None, str | None]:
    """The training's own line a fatal signal ended the rank at ("train.py:40", its function), as
    faulthandler wrote it (node/flight.py's fatal_record; under --launch); (None, None) else."""
    if not isinstance(record, dict) or record.get("how") != "fatal":
        return None, None
    own = [f for f in record.get("frames") or () if isinstance(f, dict) and isinstance(f.get("file"), str)
           and own_code(f["file"])]
    if not own:
        return None, None
    return f"{short_name(own[-1]['file'])}:{own[-1].get('line')}", str(own[-1].get("function"))


def owners(tracks: list[Track]) -> dict[str, Who]:
    """Whose each TCP endpoint is ("ip:port" -> rank key), from the ranks' counted sockets."""
    return {endpoint: t.key for t in tracks for endpoint in t.endpoints}


def closed_first(state: State, tracks: list[Track]) -> dict[Who, tuple[frozenset, frozenset]]:
    """Who closed each connection between two ranks first, as the kernel says: the side that
    closed first holds the connection in TIME_WAIT for a minute after. For each rank: (the ranks it
    closed a connection with first, the ranks that closed one with it first)."""
    owner = owners(tracks)
    first: dict[Who, set[Who]] = {}
    on: dict[Who, set[Who]] = {}
    for local, remote in state.closures:
        closer, peer = owner.get(local), owner.get(remote)
        if closer is None or peer is None or closer == peer:
            continue
        first.setdefault(closer, set()).add(peer)
        on.setdefault(peer, set()).add(closer)
    return {key: (frozenset(first.get(key, ())), frozenset(on.get(key, ()))) for key in set(first) | set(on)}


def _peers(state: State, t: Track) -> list[Track]:
    """The other ranks of its run whose connections are known (their endpoints were counted)."""
    return [o for o in state.ranks.values() if o.run == t.run and o is not t and o.endpoints]


def _stopped_by(state: State, t: Track) -> exits.StoppedBy | None:
    """The launcher that began stopping its node before it ended: ddp-preflight, when it had begun
    stopping every node (node None; the root of any stop after it), else torchrun on its node (the
    latest such). torchrun's stop is on the rank's own node's clock; ddp-preflight's on this
    machine's, so the rank must have ended after it by more than its node's clock margin."""
    if t.exit_t is None:
        return None
    apart = margin(state, t.view.node)
    stops = [(node is None, at, by) for node, at, by in state.launcher_stops
             if (node is None and at <= t.exit_t - apart) or node == t.view.node and at <= t.exit_t]
    return exits.StoppedBy(max(stops)[2]) if stops else None


def last_run(state: State, run: int | None = None) -> int | None:
    """The run whose ends are judged: `run`, or the one whose rank ended last; None when no rank
    of it ended."""
    ended = [t for t in state.ranks.values() if t.ended and t.gone_at is not None and (run is None or t.run == run)]
    return max(ended, key=lambda t: t.gone_at or 0.0).run if ended else None


def judge(state: State, now: float, wall: float, run: int | None = None) -> Diagnosis | None:
    """The verdict on a run's ends (by default the run whose rank ended last)."""
    run = last_run(state, run)
    if run is None:
        return None
    tracks = [t for t in state.ranks.values() if t.run == run]
    running = [evidence_of(state, t, now) for t in tracks if not t.ended]
    closed, owner = closed_first(state, tracks), owners(tracks)
    found = named.judge([ending_of(state, t, closed, owner) for t in tracks if t.ended], running,
                        unseen=unseen(state), context=context(state))
    if found is None:
        return None
    apart = clocks_apart(state)
    found = replace(found, clocks_apart=apart if apart > CLOCK_STEP else None,
                    notes=notes.of_verdict(state.config.notes, found, {t.key: t.view.node for t in tracks}))
    return found


def unseen(state: State) -> list[Evidence]:
    """The ranks of the launch plan that nothing shows (no agent found them, no end of theirs was
    told, in any run): the same as the files' ranks in no torchrun table (explain/ended.py), so a
    rank that left cleanly before any agent saw it is the peer the others lost, as explain says."""
    seen = {t.key for t in state.ranks.values()}
    return [Evidence(node, None, rank, RankStatus.UNKNOWN) for rank, node in sorted(state.config.planned.items())
            if rank not in seen]


def context(state: State) -> named.Context:
    """What the watcher knows of the run beyond its ends: the master's node (rank 0's in a launch
    plan, else the first node watched), the nodes in order, and whether it is a launch."""
    nodes = tuple(state.nodes)
    planned = state.config.planned
    master = planned.get(0) or (nodes[0] if nodes else None)
    order = tuple(dict.fromkeys(planned[r] for r in sorted(planned))) or nodes
    return named.Context(master, order, bool(planned))

