"""The agents' messages into the watcher's state: each node's agent, the ranks it finds (which run
each belongs to, two processes that claim one rank), its samples, stacks and exits. The decisions
on what they show are elsewhere: progress.py (who still makes progress), ended.py (how a rank
ended), verdicts.py (what the ranks together say)."""

from __future__ import annotations

from dataclasses import replace

from ddp_preflight.node import protocol

from . import alone, ended, progress, runs, stall
from .classify import classify
from .events import EventKind
from .evidence import evidence_of, shown
from .inputs import AgentMessage, AskStacks, BringPySpy, Effect, Send
from .model import NodeStatus, RankStatus, RankView, Reason
from .prefixes import split_prefix
from .state import GONE, SILENT, Launcher, State, Track, Withheld, notice, remember, say

S = RankStatus
__all__ = ["GONE", "SILENT", "from_agent", "ask_stacks", "clocks_due", "lose", "set_node", "silent"]


def from_agent(state: State, node: str, message: AgentMessage, now: float, wall: float, out: list[Effect]) -> None:
    state.heard[node] = now
    if state.lost.get(node) == SILENT:
        del state.lost[node]
        set_node(state, node, NodeStatus.WATCHING, f"{node} watched again: its agent reports again; its ranks' "
                 "stacks are taken afresh", out, again=True)
        ask_stacks(state, now, out)
    if isinstance(message, protocol.Hello):
        state.hello[node] = message
        set_node(state, node, NodeStatus.WATCHING, None, out, agent_pid=message.pid)
        ask_clock(state, node, now, wall, out)
        if message.py_spy_refused:
            _refused_py_spy(state, node, message.py_spy_refused, message.py_spy, out)
        if not message.py_spy:
            out.append(BringPySpy(node))
        if message.missing:
            # attach --pid of no process on that node: the attach ends on it (cli/hangwatch.py).
            out.append(say(EventKind.NOTICE, f"--pid {', '.join(f'{node}:{p}' for p in message.missing)}: no such "
                           f"process on {node}; give the pid of a running rank or torchrun (ps -ef)",
                           node=node, missing=list(message.missing)))
    elif isinstance(message, protocol.PySpyAnswer):
        if message.refused:
            _refused_py_spy(state, node, message.refused, message.path, out)
    elif isinstance(message, protocol.RankFound):
        _rank_found(state, node, message, now, out)
    elif isinstance(message, protocol.Sample):
        if message.t:
            state.clock_gap[node] = min(state.clock_gap.get(node, wall - message.t), wall - message.t)
        _sample(state, node, message, now, out)
        alone.connections(state, node, message, now, wall, out)
    elif isinstance(message, protocol.Stacks):
        _stacks(state, node, message, now, out)
    elif isinstance(message, protocol.Stores):
        _stores(state, message.stores, now)
    elif isinstance(message, protocol.LauncherFound):
        if runs.followed(state, node, message):
            if runs.own(state, node, message):
                runs.drop_others(state, node, out)
            state.launchers[(node, message.pid)] = Launcher(node, message)
            state.found_any = True
        else:
            runs.refuse(state, node, message, out)
    elif isinstance(message, protocol.ClockAnswer):
        _clock(state, node, message, wall)
    elif isinstance(message, protocol.RankExit):
        track = state.ranks.get((node, message.pid))
        if track is not None:
            ended.rank_exit(state, track, own_lines(track, message), now, out)


def own_lines(t: Track, exit: protocol.RankExit) -> protocol.RankExit:
    """Its exit with the output lines that are its own. A file other processes write too (every
    rank of `torchrun ... > node.log` inherits it) holds every rank's lines: a line is this rank's
    only where its own prefix says so (torch's "[rank3]: " on an uncaught exception's lines, or
    --tee's "[default1]:" of its local rank; prefixes.py reads them as everywhere). A line without
    one could be any of them, and is pinned on none."""
    if not exit.shared or not exit.output:
        return exit
    mine = []
    for line in exit.output:
        origin = split_prefix(line)[0]
        if origin.marker is not None:
            if origin.marker == t.view.rank:
                mine.append(line)
        elif origin.local_rank is not None and origin.local_rank == t.view.local_rank:
            mine.append(line)
    return replace(exit, output=tuple(mine))


# The asks whose answers are known by their id: an answer comes within ASK_TIMEOUT, or seconds
# after it on a loaded node; one older than this is from a watch long past.
ASKS_KEPT = 600.0
CLOCK_EVERY = 10.0        # seconds between readings of each node's clock


def ask_clock(state: State, node: str, now: float, wall: float, out: list[Effect]) -> None:
    state.clock_asked[node] = now
    out.append(Send(node, {"cmd": "clock", "t": wall}))


def clocks_due(state: State, now: float, wall: float, out: list[Effect]) -> None:
    for node, n in state.nodes.items():
        if n.status is NodeStatus.WATCHING and now - state.clock_asked.get(node, now) >= CLOCK_EVERY:
            ask_clock(state, node, now, wall, out)


def _clock(state: State, node: str, answer: protocol.ClockAnswer, wall: float) -> None:
    """A reading of the node's clock: its offset from the master's to within half the round trip;
    the reading with the shortest round trip is kept."""
    if answer.asked is None or answer.t is None:
        return
    trip = wall - answer.asked
    if trip < 0:
        return
    best = state.clocks.get(node)
    if best is None or trip < best[0]:
        state.clocks[node] = (trip, answer.t - (answer.asked + wall) / 2)


def set_node(state: State, name: str, status: NodeStatus, message: str | None, out: list[Effect], **data) -> None:
    node = state.nodes[name]
    node.status, node.message = status, message
    if message:
        remember(state, message)
    out.append(say(EventKind.NODE, message or f"{name}: {status.value}", node=name, status=status.value, **data))


def _refused_py_spy(state: State, node: str, why: str, taken: str | None, out: list[Effect]) -> None:
    """Each py-spy the agent would not run (node/pyspy.py: "the py-spy it was given: why; the
    py-spy at PATH: why"), and the one it runs instead, if any."""
    then = (f"stacks are taken with {taken}" if taken else
            "stacks are missing; fix: pip install py-spy in the training environment on that node")
    notice(state, f"{node}: the agent did not run {why}; {then}", out)


def lose(state: State, node: str, how: str, message: str, out: list[Effect]) -> None:
    """Its ranks are unknown from now on: their stacks and CPU are from before and say nothing
    now, so none of it is judged (a rank nobody sees may be computing)."""
    state.lost[node] = how
    for t in state.tracks(node):
        if not t.ended:
            t.view.state, t.view.op, t.view.frame, t.view.function = S.UNKNOWN, None, None, None
            progress.forget(t)
            t.dump, t.dump_error, t.stack_at = None, None, None
    state.asked.pop(node, None)
    state.native_due.discard(node)
    if not state.asked:
        state.asked_at = None
    set_node(state, node, NodeStatus.LOST, message, out)


def silent(state: State, now: float) -> list[tuple[str, float]]:
    """Watched nodes whose agent has said nothing for a few sample intervals, and for how long."""
    after = state.config.silent_after
    return [(name, now - state.heard[name]) for name, n in state.nodes.items()
            if n.status is NodeStatus.WATCHING and name in state.heard and now - state.heard[name] >= after]


def _rank_found(state: State, node: str, info: protocol.RankFound, now: float, out: list[Effect]) -> None:
    if not runs.followed(state, node, info):
        runs.refuse(state, node, info, out)
        return
    if runs.own(state, node, info):
        runs.drop_others(state, node, out)
    view = RankView(node=node, pid=info.pid, rank=info.rank, local_rank=info.local_rank, world_size=info.world_size)
    track = Track(view, info.start, info=info, run=runs.run_of(state, node, info))
    for key in state.claiming(node, info.rank) if info.rank is not None else []:
        t = state.ranks[key]
        if t.view.pid == info.pid:
            continue
        if t.ended:
            del state.ranks[key]          # a restarted rank, or an earlier run's: the new one replaces it
            state.unindex()
        elif t.run != track.run:
            continue                      # another live run's rank (judged apart): never replaced by this one
        else:
            # Two live processes claim one rank: both are watched, neither replaces the other, and
            # each is named by its pid from now on.
            t.duplicate = track.duplicate = True
            notice(state, f"{node}: two live processes claim rank {info.rank}: pid {t.view.pid} and pid {info.pid} "
                   "(two runs at once, or a helper the rank finder took for a rank); both are watched and named "
                   "by pid", out)
    state.found((node, info.pid), track)
    state.found_any = True
    state.nodes[node].ranks = state.count(node)
    env = info.env or {}
    state.nodes[node].interface = env.get("GLOO_SOCKET_IFNAME") or env.get("NCCL_SOCKET_IFNAME") \
        or state.nodes[node].interface
    if not info.env_readable:
        notice(state, f"{node}: cannot read pid {info.pid}'s environment (another user's process), so its "
               "rank is unknown; fix: run hangwatch as the user who runs the training, or as root", out)
    out.append(say(EventKind.RANK_FOUND, f"{node}: found {view.label} (pid {view.pid}"
                   f"{', world ' + str(view.world_size) if view.world_size else ''})",
                   node=node, pid=view.pid, rank=view.rank))


def _sample(state: State, node: str, msg: protocol.Sample, now: float, out: list[Effect]) -> None:
    state.samples[node] = state.samples.get(node, 0) + 1
    state.nodes[node].net_bytes_per_s = msg.net
    state.closures.update(msg.closures)
    _launchers(state, node, msg, now)
    gpus = {g.index: g for g in msg.gpus}
    if gpus:
        state.gpu_nodes.add(node)
    for s in msg.ranks:
        t = state.ranks.get((node, s.pid))
        if t is None:
            continue
        t.view.wchan = s.wchan
        t.view.waits_in = s.waits_in if isinstance(s.waits_in, dict) else None
        if s.endpoints is not None:
            t.endpoints = t.endpoints | frozenset(s.endpoints)     # every endpoint it had: closed ones too
        if s.links is not None:
            t.links = frozenset((str(a), str(b)) for a, b in s.links)
        if s.exit is not None:       # caught as a zombie, before its exit notice
            if not t.ended:
                ended.zombie(state, t, protocol.ExitStatus.from_wait_status(s.exit), msg.t, now, out)
            continue
        progress.sampled(state, t, s, gpus.get(s.gpu) if s.gpu is not None else None, now)
        _computes_where_withheld(state, t, node, now)
    for pid in msg.gone:
        t = state.ranks.get((node, pid))
        if t is not None and not t.ended:
            ended.vanished(state, t, msg.t, now, out)


def _launchers(state: State, node: str, msg: protocol.Sample, now: float) -> None:
    """Each torchrun's CPU and ranks: one that uses no CPU and has started no rank waits in its
    rendezvous for the other nodes' torchruns, unless a torchrun of its run (its store) has started
    ranks: the nodes came, and one whose ranks ended waits at its exit barrier for the others to
    finish, or is leaving."""
    sampled = {s.pid: s for s in msg.launchers}
    for (where, pid), launcher in list(state.launchers.items()):
        if where != node:
            continue
        s = sampled.get(pid)
        if s is None:
            del state.launchers[(where, pid)]          # gone
            if not any(other.info.master == launcher.info.master for other in state.launchers.values()):
                state.formed.discard(launcher.info.master)      # that run is over: the next at its store is another
            continue
        launcher.ranks = s.ranks
        launcher.had_ranks = launcher.had_ranks or s.ranks > 0
        if launcher.had_ranks:
            state.formed.add(launcher.info.master)
        quiet = s.cpu is not None and s.cpu < stall.IDLE_CPU and not launcher.had_ranks \
            and launcher.info.master not in state.formed
        if not quiet:
            launcher.quiet_since = None
        elif launcher.quiet_since is None:
            launcher.quiet_since = now - state.config.interval


def _stacks(state: State, node: str, msg: protocol.Stacks, now: float, out: list[Effect]) -> None:
    permission, traced = [], []
    # Asked for: taken after its own ask (the id it answers). On a loaded node the agent answers
    # asks late and one after another: the answer to an ask made before the ranks went quiet can
    # come after a newer ask, and says nothing of now. Taken by the agent on its own: shortly
    # before now. (An id this watch never gave, a replay's: after the node's latest ask.)
    latest = state.asked.get(node)
    if msg.id is not None and msg.id in state.asks:
        taken = state.asks[msg.id]
        answers_latest = latest is None or taken >= latest
    else:
        taken = (latest if latest is not None else now - 1.0) if msg.id is not None else now - 1.0
        answers_latest = True
    for pid, dump in (msg.stacks or {}).items():
        t = state.ranks.get((node, pid))
        if t is None or t.ended:
            continue
        t.read_at = now        # its py-spy read, held it: samples from now on say whether that ended
        if t.stack_at is not None and taken < t.stack_at:
            continue           # older than the stack in hand
        if pid in msg.partial and not _decided_without_native(t, dump):
            # Its native frames follow: its Python frames alone could mislead. The stack in hand is
            # older than these: where a working rank is, it no longer says (evidence.py); its CPU
            # from now on may (_computes_where_withheld).
            if isinstance(dump, list) and (t.withheld is None or taken >= t.withheld.taken):
                t.withheld = Withheld(taken, dump, now)
            continue
        t.stack_at = taken
        if t.withheld is not None and taken >= t.withheld.taken:
            t.withheld = None
        if isinstance(dump, dict):
            t.dump, t.dump_error = None, dump.get("error")
            if dump.get("permission"):
                permission.append(str(pid))
            elif dump.get("traced_by"):
                traced.append(f"pid {pid} is {dump.get('error')}")
        else:
            t.dump, t.dump_error = dump, None
        if msg.flight and pid in msg.flight:
            progress.flight_read(t, msg.flight[pid], taken)
        if msg.sockets and pid in msg.sockets:
            t.sockets = msg.sockets[pid]
            # Its connections counted with this stack: a subgroup's mesh made since the last count
            # shows in the verdict that reads this stack (meshes.shared_groups).
            if t.sockets.links is not None:
                t.links = frozenset(t.sockets.links)
            if t.sockets.endpoints is not None:
                t.endpoints = t.endpoints | frozenset(t.sockets.endpoints)
        progress.stack_taken(state, t, taken, now)
        shown(state, t, evidence_of(state, t, now))
    _stores(state, msg.stores, now)         # an older agent's: read before its stacks were sent
    for master in msg.reading:              # read now: their answers follow (a Stores message)
        state.reading[master] = now
    if not answers_latest:
        return                              # the node's latest ask is still to be answered
    if msg.partial:
        state.native_due.add(node)
        return                              # the rest of this answer follows
    state.native_due.discard(node)
    if msg.id is not None:
        state.asked.pop(node, None)
        if not state.asked:
            state.asked_at = None
    if permission:
        notice(state, f"{node}: not permitted to read the stacks of pid {', '.join(permission)} (ptrace); "
               "fix: run hangwatch as the user who runs the training, or as root, or "
               "`sudo sysctl kernel.yama.ptrace_scope=0`; watching CPU and /proc alone", out)
    for said in traced:
        # Another tracer (a debugger, strace) holds the rank: a process has one. No permission
        # would help, and its stack could not be read even without suspending it.
        notice(state, f"{node}: {said}: a process has one ptrace tracer, so its stack cannot be read while that "
               "one holds it (detach it to let hangwatch read it); watching CPU and /proc alone", out)


def _computes_where_withheld(state: State, t: Track, node: str, now: float) -> None:
    """Python frames held back for their native ones show it busy at a line of its own, and it has
    used CPU over a whole sample since they came: on a node whose agent reads no GPU it computes
    there (a wait in C++ that spins is a GPU's, cudaStreamSynchronize's; a rank's own GPU may be
    unknown: NVML in a container lists other pids). The CPU of the sample before them says
    nothing: a rank that blocks in C++ under its line (a bare lock.acquire()) was busy then."""
    held = t.withheld
    if held is None or node in state.gpu_nodes or t.view.gpu is not None or t.idle_since is not None \
            or t.busy_at is None or t.busy_at < held.seen + state.config.interval:
        return
    if classify(held.dump, t.view.cpu, t.view.wchan, waits_in=t.view.waits_in).state is not RankStatus.COMPUTING:
        return
    t.dump, t.dump_error, t.stack_at, t.withheld = held.dump, None, held.taken, None
    shown(state, t, evidence_of(state, t, now))


def _decided_without_native(t: Track, dump) -> bool:
    """A rank's Python frames alone (its native ones to follow) say where it waits wherever native
    frames would only show how that same wait is done: under backward() with no CPU, DDP's gradient
    all_reduce (native frames would name the reducer); in a DataLoader's, a checkpoint's or a
    compiler's code; in a lock, a condition or a queue of Python's threading; asleep. A rank idle
    or working at a line of its own is not decided: a wait in C++ under that line (work.wait(), a
    bare Lock.acquire(), a store's get, Gloo's recv; a host thread spinning on its GPU) shows only
    in them (one busy since, on a node with no GPU, computes there: _computes_where_withheld).
    A rank the kernel holds stopped (SIGSTOP: state T) is decided too: the kernel says why, its
    Python frames where; native frames would only say how deep under that line (CI: a stopped
    rank's native read took 7 s and held its deadlock's verdict past the threshold)."""
    if not isinstance(dump, list):
        return False
    if t.proc_state == "T":
        return True
    found = classify(dump, t.view.cpu, t.view.wchan, waits_in=t.view.waits_in)
    return found.state in (RankStatus.COLLECTIVE, RankStatus.LOADING_DATA, RankStatus.SAVING, RankStatus.COMPILING,
                           RankStatus.IMPORTING) \
        or found.reason in (Reason.WAITS_ON_LOCK, Reason.SLEEPS)


def _stores(state: State, answers: tuple, now: float) -> None:
    """What the stores said. Every agent with a rank waiting on a store reads it: an answer that
    names the ranks checked in is kept over a failed read of the same store in the same stall (an
    agent on a node the store is firewalled from)."""
    for answer in answers:
        state.reading.pop(answer.master, None)
        kept = state.stores.get(answer.master)
        if answer.error and kept is not None and not kept[0].error and now - kept[1] < stall.ASK_TIMEOUT:
            continue
        state.stores[answer.master] = (answer, now)


def ask_stacks(state: State, now: float, out: list[Effect], nodes: tuple[str, ...] | None = None,
               native: bool | str | None = None) -> None:
    """Ask the watched nodes (those given) for their ranks' stacks: native frames as configured,
    else in a stall's way ("stall": where Python frames cannot say), or as `native` says."""
    watching = tuple(name for name, n in state.nodes.items() if n.status is NodeStatus.WATCHING
                     and (nodes is None or name in nodes))
    if not watching:
        return
    state.asked_at = now
    for name in watching:
        state.asked[name] = now
    ask = int(now * 1000)
    state.asks = {i: at for i, at in state.asks.items() if now - at < ASKS_KEPT}
    state.asks[ask] = now
    # The ranks followed on each node: the agent reads no other process (another user's).
    pids = {name: sorted(t.view.pid for t in state.tracks(name) if not t.ended) for name in watching}
    out.append(AskStacks(watching, {"cmd": "stacks", "id": ask,
                                    "native": native if native is not None else
                                    True if state.config.native else "stall", "pids": pids}))
