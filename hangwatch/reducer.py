"""The watcher's logic, as a reducer: `step(state, input, now, wall) -> effects`.

Pure: no threads, no clock, no I/O. The inputs are what happened (an agent's message, an agent
that closed, time passing, a bundle written), the effects are what the shell (watch.py) must do
(say an event, ask the agents for stacks, write a bundle, bring py-spy to a node). `now` is
monotonic seconds, `wall` the epoch time for what is shown. The state is updated in place and
nothing else is touched: no copies on the hot path, which takes every agent's sample each
second (bench/hangwatch_scale.py replays 1,024 ranks through it).

A rank is idle when its whole process used under IDLE_CPU of a core over a sample. When the
longest idle time passes half the threshold, every rank's stack is asked for; a stack taken
after a rank became idle shows where it is as long as it stays idle (it cannot move without
CPU), so the hang is named the moment the threshold passes (stall.py). What the ranks together
say is decided by diagnose.py from each rank's state (classify.py)."""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from node import protocol
from node.protocol import ExitStatus

from . import stall
from .classify import BUSY_CPU, RankState, classify, frames_of
from .diagnose import connected_late, diagnose, rendezvous_stall, trains_alone
from .model import HISTORY, Diagnosis, Event, Kind, NodeStatus, NodeView, RankStatus, RankView, Snapshot

S = RankStatus
PEER_LOSS = (ExitStatus(code=1), ExitStatus(signal=signal.SIGABRT))   # how a rank that lost its Gloo peer ends
PEER_LOSS_WINDOW = 1.0    # seconds: exits this close to the first failure may be its echo
CLEAN_LEAD = 120.0        # s: a clean exit this long before a failure may have caused it (its peers
                          # fail at their next collective); an earlier one was another run's end
CLOCK_STEP = 0.1          # s: nodes' clocks this close (NTP keeps them within ms) are taken as one clock; the
                          # gap measured also holds each agent's delivery delay (ms on a LAN, under SSH)
EXIT_SETTLE = 2.0         # seconds after an exit before the exits are judged: the others follow fast
FLOWING = 256 * 1024      # bytes/s on a node's links: a collective still moving data is slow, not stalled
SILENT_SAMPLES = 5        # an agent reports every sample interval: this many missed, its node is lost
SILENT_FLOOR = 2.0        # seconds: never less, however short the interval
GONE, SILENT = "is gone", "went silent"      # how a node's agent was lost
MESSAGES = 200            # notices kept (the snapshot shows the last 20)
ENDLESS_TIMES = 5         # a straggler that keeps the others waiting this many thresholds is a hang
ALONE_AFTER = 30.0        # seconds every rank works with no connection before "each rank trains alone"
GPU_BUSY, GPU_IDLE_MEMORY = 90.0, 0.0   # % a GPU shows when one kernel spins and never touches memory


ENDLESS_CAUSES = ("a loop that never ends: a data loader that cycles forever (too few shards on that node: "
                  "ddp-preflight's data-shards), a retry loop, a while loop whose condition never changes",
                  "far more work on this rank than on the others (uneven data)")


# -- inputs ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class FromAgent:
    node: str
    message: object            # a node.protocol agent message (Hello, RankFound, Sample, ...)


@dataclass(frozen=True)
class AgentClosed:
    node: str
    why: str | None            # None: it ended cleanly


@dataclass(frozen=True)
class AgentFailed:
    node: str
    why: str                   # its agent did not start


@dataclass(frozen=True)
class Tick:
    """Time passed (the shell ticks four times a second)."""


@dataclass(frozen=True)
class Notice:
    text: str


@dataclass(frozen=True)
class BundleWritten:
    path: str


@dataclass(frozen=True)
class BundleFailed:
    why: str


@dataclass(frozen=True)
class TakeStacks:
    """The user asked for every rank's stack now (the dashboard's d)."""


@dataclass(frozen=True)
class Stopping:
    """The watch is ending: agents closing now are not lost nodes."""


# -- effects ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Say:
    event: Event


@dataclass(frozen=True)
class AskStacks:
    nodes: tuple[str, ...]
    command: dict


@dataclass(frozen=True)
class WriteBundle:
    snapshot: Snapshot
    details: dict


@dataclass(frozen=True)
class BringPySpy:
    node: str


@dataclass(frozen=True)
class HangNamed:
    bundle: str                # --on-hang, --stop-on-hang: the bundle is written


# -- state -----------------------------------------------------------------------------------

@dataclass
class Track:
    """One rank as the watcher follows it: its view, and what the stall logic needs."""
    view: RankView
    start: int = 0
    idle_since: float | None = None
    info: protocol.RankFound | None = None
    dump: list | None = None
    dump_error: str | None = None
    stack_at: float | None = None     # when the stack in hand was taken (no earlier than this)
    busy_at: float | None = None      # the last sample that used CPU
    gone_at: float | None = None
    exit_t: float | None = None       # when it exited, the node's clock (epoch s)
    exit_status: ExitStatus | None = None
    alone_since: float | None = None  # since when it has had no TCP connection (None: not counted, or it had one)
    talked: bool = False              # it has had a connection: it joined a process group

    @property
    def key(self) -> int:
        """How diagnoses name it: its rank, or its negated pid when its rank is unknown."""
        return self.view.rank if self.view.rank is not None else -self.view.pid


@dataclass(frozen=True)
class Config:
    threshold: float = stall.DEFAULT_THRESHOLD   # seconds without progress before a hang is named
    interval: float = 1.0                        # the agents' sample interval, seconds
    native: bool = False                         # native frames in every stack
    endless_after: float | None = None           # seconds a rank may compute while the others wait
                                                 # (None: ENDLESS_TIMES x the threshold)
    notes: dict[str, tuple[str, ...]] = field(default_factory=dict)   # node -> what preflight said of it
    planned: Mapping[int, str] = field(default_factory=dict)   # rank -> node, from a launch plan

    @property
    def silent_after(self) -> float:
        return max(SILENT_SAMPLES * self.interval, SILENT_FLOOR)

    @property
    def endless(self) -> float:
        return self.endless_after if self.endless_after is not None else ENDLESS_TIMES * self.threshold


@dataclass
class State:
    config: Config
    nodes: dict[str, NodeView]
    hello: dict[str, protocol.Hello] = field(default_factory=dict)
    ranks: dict[tuple[str, int], Track] = field(default_factory=dict)
    diagnosis: Diagnosis | None = None
    incidents: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    asked: dict[str, float] = field(default_factory=dict)    # node -> when stacks were asked, outstanding
    asked_at: float | None = None
    reported: str | None = None        # the diagnosis already said in this stall
    exit_check_at: float | None = None  # look at the exits once they have settled
    heard: dict[str, float] = field(default_factory=dict)    # node -> when its agent last said anything
    lost: dict[str, str] = field(default_factory=dict)       # node -> how its agent was lost
    stopping: bool = False
    stores: dict[str | None, tuple[protocol.StoreAnswer, float]] = field(default_factory=dict)  # master -> said, when
    alone: tuple[tuple[str, int], ...] = ()   # the ranks said to train alone, while that stands
    clock_gap: dict[str, float] = field(default_factory=dict)  # node -> least (master's wall - node's stamp)


def new_state(nodes: list[str], config: Config = Config()) -> State:
    return State(config, {name: NodeView(name) for name in nodes})


# -- the reducer -----------------------------------------------------------------------------

def step(state: State, event: object, now: float, wall: float) -> list:
    """Apply one input; the effects the shell must carry out, in order."""
    out: list = []
    if isinstance(event, FromAgent):
        _from_agent(state, event.node, event.message, now, wall, out)
    elif isinstance(event, Tick):
        _tick(state, now, wall, out)
    elif isinstance(event, AgentClosed):
        if not state.stopping:
            _lose(state, event.node, GONE, f"{event.node}: the agent stopped ({event.why or 'its SSH channel closed'}); "
                  "the other nodes are still watched", wall, out)
    elif isinstance(event, AgentFailed):
        _node(state, event.node, NodeStatus.ERROR, event.why, out)
    elif isinstance(event, Notice):
        _notice(state, event.text, out)
    elif isinstance(event, BundleWritten):
        state.incidents.append(event.path)
        out.append(Say(Event("incident", f"incident bundle: {event.path}", data={"path": event.path})))
        out.append(HangNamed(event.path))
    elif isinstance(event, BundleFailed):
        _notice(state, f"hangwatch: could not write the incident bundle: {event.why}", out)
    elif isinstance(event, TakeStacks):
        _ask_stacks(state, now, out)
    elif isinstance(event, Stopping):
        state.stopping = True
    return out


def snapshot(state: State, wall: float) -> Snapshot:
    """A copy of what the watcher knows, as the dashboard and --json show it."""
    ranks = sorted((replace(t.view, history=list(t.view.history)) for t in state.ranks.values()),
                   key=lambda v: (v.rank is None, v.rank if v.rank is not None else 0, v.node, v.pid))
    return Snapshot(time=wall, threshold=state.config.threshold, nodes=[replace(n) for n in state.nodes.values()],
                    ranks=ranks, diagnosis=state.diagnosis, incidents=list(state.incidents),
                    messages=list(state.messages[-20:]))


def details(state: State) -> dict:
    """What an incident bundle keeps beyond the snapshot: each node's agent hello (versions)
    and each rank's environment (secrets redacted) and command line."""
    return {"nodes": {name: {k: v for k, v in vars(h).items()} for name, h in state.hello.items()},
            "ranks": {f"{n}:{p}": {"argv": list(t.info.argv) if t.info else None,
                                   "env": t.info.env if t.info else None,
                                   "master": t.info.master if t.info else None}
                      for (n, p), t in state.ranks.items()}}


# -- messages from agents ---------------------------------------------------------------------

def _from_agent(state: State, node: str, message, now: float, wall: float, out: list) -> None:
    state.heard[node] = now
    if state.lost.get(node) == SILENT:
        del state.lost[node]
        _node(state, node, NodeStatus.WATCHING, f"{node} watched again: its agent reports again; its ranks' "
              "stacks are taken afresh", out, again=True)
        _ask_stacks(state, now, out)
    if isinstance(message, protocol.Hello):
        state.hello[node] = message
        _node(state, node, NodeStatus.WATCHING, None, out, agent_pid=message.pid)
        if message.py_spy_refused:
            _refused_py_spy(state, node, message.py_spy_refused, out)
        if not message.py_spy:
            out.append(BringPySpy(node))
    elif isinstance(message, protocol.PySpyAnswer):
        if message.refused:
            _refused_py_spy(state, node, message.refused, out)
    elif isinstance(message, protocol.RankFound):
        _rank_found(state, node, message, out)
    elif isinstance(message, protocol.Sample):
        if message.t:
            state.clock_gap[node] = min(state.clock_gap.get(node, wall - message.t), wall - message.t)
        _sample(state, node, message, now, out)
        _connections(state, node, message, now, wall, out)
    elif isinstance(message, protocol.Stacks):
        _stacks(state, node, message, now, out)
    elif isinstance(message, protocol.RankExit):
        _exit(state, node, message, now, out)


def _say(kind: str, text: str, **data) -> Say:
    return Say(Event(kind, text, None, data))


def _node(state: State, name: str, status: NodeStatus, message: str | None, out: list, **data) -> None:
    node = state.nodes[name]
    node.status, node.message = status, message
    if message:
        _remember(state, message)
    out.append(_say("node", message or f"{name}: {status.value}", node=name, status=status.value, **data))


def _remember(state: State, text: str) -> None:
    state.messages.append(text)
    del state.messages[:-MESSAGES]


def _notice(state: State, text: str, out: list) -> None:
    if text in state.messages:
        return
    _remember(state, text)
    out.append(_say("notice", text))


def _refused_py_spy(state: State, node: str, why: str, out: list) -> None:
    _notice(state, f"{node}: the agent did not run the py-spy it was given: {why}; stacks from it are "
            "missing; fix: pip install py-spy in the training environment on that node", out)


def _lose(state: State, node: str, how: str, message: str, wall: float, out: list) -> None:
    """Its ranks are unknown from now on: their stacks and CPU are from before and say nothing
    now, so none of it is judged (a rank nobody sees may be computing)."""
    state.lost[node] = how
    for t in state.ranks.values():
        if t.view.node == node and t.view.state is not S.EXITED:
            t.view.state, t.view.op, t.view.frame, t.view.function = S.UNKNOWN, None, None, None
            t.view.idle_for, t.idle_since, t.busy_at = 0.0, None, None
            t.dump, t.dump_error, t.stack_at = None, None, None
    state.asked.pop(node, None)
    if not state.asked:
        state.asked_at = None
    _node(state, node, NodeStatus.LOST, message, out)


def _rank_found(state: State, node: str, info: protocol.RankFound, out: list) -> None:
    # A restarted rank (same rank number, new pid) replaces its old entry.
    for key, t in list(state.ranks.items()):
        if t.view.node == node and info.rank is not None and t.view.rank == info.rank and t.view.pid != info.pid:
            del state.ranks[key]
    view = RankView(node=node, pid=info.pid, rank=info.rank, local_rank=info.local_rank, world_size=info.world_size)
    state.ranks[(node, info.pid)] = Track(view, info.start, info=info)
    state.nodes[node].ranks = sum(1 for t in state.ranks.values() if t.view.node == node)
    env = info.env or {}
    state.nodes[node].interface = env.get("GLOO_SOCKET_IFNAME") or env.get("NCCL_SOCKET_IFNAME") \
        or state.nodes[node].interface
    if not info.env_readable:
        _notice(state, f"{node}: cannot read pid {info.pid}'s environment (another user's process), so its "
                "rank is unknown; fix: run hangwatch as the user who runs the training, or as root", out)
    out.append(_say("rank-found", f"{node}: found {view.label} (pid {view.pid}"
                    f"{', world ' + str(view.world_size) if view.world_size else ''})",
                    node=node, pid=view.pid, rank=view.rank))


def _sample(state: State, node: str, msg: protocol.Sample, now: float, out: list) -> None:
    state.nodes[node].net_bytes_per_s = msg.net
    gone = []
    interval = state.config.interval
    gpus = {g.index: g for g in msg.gpus}
    for s in msg.ranks:
        t = state.ranks.get((node, s.pid))
        if t is None:
            continue
        v = t.view
        v.wchan = s.wchan
        if s.exit is not None:       # caught as a zombie, before its exit notice
            if v.state is not S.EXITED:
                _exited(state, t, ExitStatus.from_wait_status(s.exit), msg.t, now)
                gone.append(v)
            continue
        if s.cpu is None:
            continue
        v.cpu = s.cpu
        v.history.append(s.cpu)
        del v.history[:-HISTORY]
        gpu = gpus.get(s.gpu) if s.gpu is not None else None
        v.gpu = s.gpu
        v.gpu_util, v.gpu_memory_util = (gpu.util, gpu.memory_util) if gpu is not None else (None, None)
        # A GPU busy with one kernel that touches no memory is not progressing, though its rank's
        # host thread spins at full CPU waiting for it: as good as idle for the stall logic.
        spinning = gpu is not None and gpu.util is not None and gpu.util >= GPU_BUSY \
            and gpu.memory_util is not None and gpu.memory_util <= GPU_IDLE_MEMORY
        if s.cpu < stall.IDLE_CPU or spinning:
            if t.idle_since is None:
                # Idle over this whole sample, and over the part of the one before that it did
                # not use: a rank that computes, then blocks, stops mid-sample.
                before = v.history[-2] if len(v.history) > 1 else 100.0
                t.idle_since = now - interval * (2 - min(before, 100.0) / 100)
        else:
            t.idle_since, t.busy_at = None, now
            if v.state in (S.IDLE, S.COLLECTIVE, S.RENDEZVOUS, S.UNKNOWN) and t.dump is not None:
                v.state = S.RUNNING          # moving again: the old stack no longer says where
        v.idle_for = round(now - t.idle_since, 1) if t.idle_since is not None else 0.0
    for pid in msg.gone:
        t = state.ranks.get((node, pid))
        if t is not None and t.view.state is not S.EXITED:
            _exited(state, t, None, msg.t, now)
            gone.append(t.view)
    for v in gone:
        out.append(_say("rank-gone", f"{node}: {v.label} {v.exit}", node=node, pid=v.pid, rank=v.rank, exit=v.exit))


def _exited(state: State, t: Track, status: ExitStatus | None, at: float | None, now: float) -> None:
    v = t.view
    v.exit = str(status) if status is not None else "exited (its parent collected the exit code)"
    v.state, v.cpu, t.idle_since, v.idle_for = S.EXITED, 0.0, None, 0.0
    t.gone_at, t.exit_t, t.exit_status = now, _on_one_clock(state, v.node, at), status
    state.exit_check_at = now + EXIT_SETTLE


def _clocks_apart(state: State) -> float:
    """How far apart the nodes' clocks are, as far as the agents' stamps show: each node's least
    (master's wall - its stamp) is its clock's offset plus its quickest delivery."""
    gaps = state.clock_gap.values()
    return max(gaps) - min(gaps) if len(state.clock_gap) > 1 else 0.0


def _on_one_clock(state: State, node: str, at: float | None) -> float | None:
    """A node's time stamp, put on the master's clock when the nodes' clocks are apart: the order
    of exits on different nodes is then still the order they happened in."""
    if at is None or node not in state.clock_gap or _clocks_apart(state) <= CLOCK_STEP:
        return at
    return at + state.clock_gap[node]


def _exit(state: State, node: str, msg: protocol.RankExit, now: float, out: list) -> None:
    """The agent saw the exit the moment it happened (pidfd), with the code if it was quick."""
    t = state.ranks.get((node, msg.pid))
    if t is None:
        return
    fresh = t.view.state is not S.EXITED
    if fresh or t.exit_status is None:
        _exited(state, t, ExitStatus.from_wait_status(msg.code) if msg.code is not None else None, msg.t, now)
    if fresh:
        out.append(_say("rank-gone", f"{node}: {t.view.label} {t.view.exit}", node=node, pid=t.view.pid,
                        rank=t.view.rank, exit=t.view.exit))


def _stacks(state: State, node: str, msg: protocol.Stacks, now: float, out: list) -> None:
    permission = []
    # Asked for: taken after the ask. Taken by the agent on its own: shortly before now.
    taken = state.asked.get(node, now - 1.0) if msg.id is not None else now - 1.0
    for pid, dump in (msg.stacks or {}).items():
        t = state.ranks.get((node, pid))
        if t is None or t.view.state is S.EXITED:
            continue
        t.stack_at = taken
        if isinstance(dump, dict):
            t.dump, t.dump_error = None, dump.get("error")
            if dump.get("permission"):
                permission.append(str(pid))
        else:
            t.dump, t.dump_error = dump, None
        _classify(state, t, now)
    for pid, record in (msg.flight or {}).items():
        t = state.ranks.get((node, pid))
        if t is not None:
            t.view.flight = record
    for answer in msg.stores:
        state.stores[answer.master] = (answer, now)
    if msg.id is not None:
        state.asked.pop(node, None)
        if not state.asked:
            state.asked_at = None
    if permission:
        _notice(state, f"{node}: not permitted to read the stacks of pid {', '.join(permission)} (ptrace); "
                "fix: run hangwatch as the user who runs the training, or as root, or "
                "`sudo sysctl kernel.yama.ptrace_scope=0`; watching CPU and /proc alone", out)


def _classify(state: State, t: Track, now: float) -> RankState:
    v = t.view
    if v.state is S.EXITED:
        return RankState(S.EXITED, evidence=(v.exit or "exited",))
    if state.nodes[v.node].status in (NodeStatus.LOST, NodeStatus.ERROR):
        # Its stack and CPU are from before the node was lost: they say nothing now.
        v.state, v.op, v.frame, v.function = S.UNKNOWN, None, None, None
        return RankState(S.UNKNOWN, evidence=(f"not watched: {v.node}'s agent {state.lost.get(v.node, GONE)}",))
    found = classify(t.dump, v.cpu, v.wchan)
    if found.state in (S.COLLECTIVE, S.RENDEZVOUS, S.IDLE) and t.idle_since is None and \
            t.busy_at is not None and t.stack_at is not None and t.busy_at > t.stack_at:
        # It has used CPU since its stack showed it waiting: the stack no longer says where.
        found = RankState(S.COMPUTING if v.cpu >= BUSY_CPU else S.RUNNING,
                          evidence=(f"CPU {v.cpu:.0f}%", "working since its last stack"))
    if t.dump is None and t.dump_error:
        found = replace(found, evidence=(f"no stack: {t.dump_error}",))
    v.state, v.op = found.state, found.op
    v.frame = found.frame.where if found.frame else None
    v.function = found.frame.function if found.frame else None
    v.stack = [{"function": f.function, "file": f.file, "line": f.line} for f in frames_of(t.dump)] if t.dump else None
    return found


# -- stall logic -----------------------------------------------------------------------------

def _ask_stacks(state: State, now: float, out: list) -> None:
    watching = tuple(name for name, n in state.nodes.items() if n.status is NodeStatus.WATCHING)
    if not watching:
        return
    state.asked_at = now
    for name in watching:
        state.asked[name] = now
    out.append(AskStacks(watching, {"cmd": "stacks", "id": int(now * 1000),
                                    "native": True if state.config.native else "stall"}))


def _tick(state: State, now: float, wall: float, out: list) -> None:
    for node, quiet in _silent(state, now):
        _lose(state, node, SILENT, f"{node} lost: its agent has sent nothing for {quiet:.0f} s (the link or "
              "the node is down); its ranks are unknown until it reports again; the other nodes are still "
              "watched", wall, out)
    live = [t for t in state.ranks.values() if t.view.state is not S.EXITED]
    exited = [t for t in state.ranks.values() if t.view.state is S.EXITED]
    idle = [t for t in live if t.idle_since is not None]
    for t in live:
        t.view.idle_for = round(now - t.idle_since, 1) if t.idle_since is not None else 0.0
    if state.exit_check_at is not None and now >= state.exit_check_at:
        state.exit_check_at = None
        first, apart = _first_failure(state, exited), _clocks_apart(state)
        if first is not None and apart > CLOCK_STEP:
            first = replace(first, summary=first.summary + f" (the nodes' clocks are {apart:.1f} s apart: exit "
                            "times are put on the master's clock)")
        if first is not None:
            _report(state, first, 0.0, wall, out)
    # Progress is seen on watched nodes only: a lost node's ranks are neither idle nor not.
    watched = [t for t in live if state.nodes[t.view.node].status is NodeStatus.WATCHING]
    if watched and not idle:
        if state.diagnosis is not None and state.diagnosis.kind not in (Kind.EXITED, Kind.ALONE):
            state.diagnosis, state.reported = None, None
            _remember(state, "progress resumed")
            out.append(_say("resumed", "progress resumed: no rank is idle"))
        return
    if not idle:
        return
    waiting = max(now - t.idle_since for t in idle if t.idle_since is not None)
    gone = [t.gone_at for t in exited if t.gone_at is not None]
    if gone:
        # A rank that is gone while others are idle: the stall began when it left.
        waiting = max(waiting, now - min(gone))
    covered = all(t.stack_at is not None and t.idle_since is not None and t.stack_at >= t.idle_since for t in idle)
    newest = max((t.stack_at for t in live if t.stack_at is not None), default=None)
    plan = stall.plan(waiting, state.config.threshold, covered, None if newest is None else now - newest,
                      None if state.asked_at is None else now - state.asked_at)
    if plan.take_stacks:
        _ask_stacks(state, now, out)
    if plan.diagnose:
        _diagnose(state, waiting, now, wall, out)


def _silent(state: State, now: float) -> list[tuple[str, float]]:
    """Watched nodes whose agent has said nothing for a few sample intervals, and for how long."""
    after = state.config.silent_after
    return [(name, now - state.heard[name]) for name, n in state.nodes.items()
            if n.status is NodeStatus.WATCHING and name in state.heard and now - state.heard[name] >= after]


def _first_failure(state: State, exited: list[Track]) -> Diagnosis | None:
    """Ranks exited and one failed: the first to go is the one to look at; the rest followed
    (torchrun stopped its siblings, Gloo peers lost their connections)."""
    # Stopped (SIGTERM, SIGINT, SIGHUP: Ctrl-C, the launcher, a scheduler) is not failed.
    failed = [t for t in exited if t.exit_status is not None and not t.exit_status.ok and not t.exit_status.stopped]
    if not failed:
        return None
    order = sorted(exited, key=lambda t: (t.exit_t is None, t.exit_t or 0.0))
    # The first that failed. Ranks that lose a Gloo peer raise (exit code 1) or abort (SIGABRT:
    # "terminate called without an active exception"), sometimes before the rank that left has
    # finished exiting; so among failures within a second of the first, one with its own code
    # or signal (sys.exit(3), SIGKILL, SIGSEGV) is the one to look at.
    failed.sort(key=lambda t: (t.exit_t is None, t.exit_t or 0.0))
    soon = [t for t in failed if t.exit_t is not None and failed[0].exit_t is not None
            and t.exit_t - failed[0].exit_t < PEER_LOSS_WINDOW]
    first = next((t for t in soon if t.exit_status not in PEER_LOSS), failed[0])
    how = "exited first" if first is order[0] else "failed on its own"
    clean = [t for t in order if t.exit_status is not None and t.exit_status.ok and t.exit_t is not None
             and first.exit_t is not None and (first.exit_t - CLEAN_LEAD < t.exit_t < first.exit_t or (
                 first.exit_status in PEER_LOSS and 0 <= t.exit_t - first.exit_t < PEER_LOSS_WINDOW))]
    if clean:
        # A clean exit before the failures, or within a second of a first failure that looks like
        # a lost peer: a rank that left while its peers still ran makes them fail (Gloo:
        # "Connection closed by peer"), at times before its own exit is over; no rank that lost a
        # peer exits cleanly. It is the one to look at.
        first, how = clean[0], "left first, while the others still ran"
    elif first.exit_status in PEER_LOSS:
        earlier = _uncoded_before(order, first)
        if earlier:
            # A rank that lost its peer can die before the rank that left has finished exiting
            # (see above); when torchrun stopped or reaped ranks right after the first to go, one
            # of those may have been leaving, and the first to go its victim.
            unsure = _unseen_exits(order, earlier[0])
            if unsure:
                return _either(state, earlier[0], unsure, order)
            return _uncoded_first(state, earlier[0], first, order)
        unsure = _unseen_exits(order, first)
        if unsure:
            return _either(state, first, unsure, order)
    summary = f"{first.view.label} on {first.view.node} {how} ({first.view.exit})" + _the_rest(state, first, order,
                                                                                               "then")
    causes = (("it left the loop early and exited: its peers lost their connection to it (uneven data: it "
               "ran out of batches; rank-dependent code)",) if how.startswith("left") else
              ("the first rank's own error: see its output (ddp-preflight --launch keeps a log per node)",
               "the ranks after it were stopped by torchrun or lost their Gloo peer"))
    return Diagnosis(Kind.EXITED, summary + _notes(state, [first]), (first.view.rank,)
                     if first.view.rank is not None else (), causes)


def _the_rest(state: State, first: Track, order: list[Track], heading: str) -> str:
    """The other exits in order, timed from `first`, and the ranks still running."""
    then = [f"{t.view.label} ({t.view.exit}, {t.exit_t - first.exit_t:+.2f} s)" for t in order
            if t is not first and t.exit_t is not None and first.exit_t is not None]
    live = [t.view.label for t in state.ranks.values() if t.view.state is not S.EXITED]
    return (f"; {heading} {', '.join(then)}" if then else "") + (f"; still running: {', '.join(live)}" if live else "")


def _uncoded_before(order: list[Track], first: Track) -> list[Track]:
    """Ranks gone before `first`, a failure that looks like a lost peer, whose code nobody read
    (torchrun reaped them first). Their exit time is when the agent saw them go, never earlier
    than the exit itself: gone before the first failure, they left before it."""
    return [t for t in order if t.exit_status is None and t.exit_t is not None and first.exit_t is not None
            and first.exit_t - CLEAN_LEAD < t.exit_t < first.exit_t]


def _uncoded_first(state: State, left: Track, first: Track, order: list[Track]) -> Diagnosis:
    """A rank gone first, its code unread, and no rank stopped or reaped within a second after it
    (that one might have been leaving): it left first; the rank after it died of the lost peer."""
    gap = (first.exit_t or 0.0) - (left.exit_t or 0.0)
    summary = (f"{left.view.label} on {left.view.node} exited first, {gap:.2f} s before "
               f"{first.view.label} on {first.view.node} died ({first.view.exit}) as a rank dies when it loses a "
               f"Gloo peer; its own exit code was collected by its parent before it could be read"
               + _the_rest(state, left, order, "then"))
    causes = ("it failed or left the loop early: its output says which (ddp-preflight --launch keeps a log per "
              "node); its peers lost their connection to it",)
    return Diagnosis(Kind.EXITED, summary + _notes(state, [left]),
                     (left.view.rank,) if left.view.rank is not None else (), causes)


def _unseen_exits(order: list[Track], first: Track) -> list[Track]:
    """Ranks stopped (SIGTERM: torchrun stopping a node's ranks when one fails) or gone with their
    code unread within a second of `first`, a failure that looks like a lost peer (or a rank gone
    first, its code unread): a rank that left (sys.exit, an exception) can be stopped before its
    own exit is over, once a peer has died of it, or reaped by torchrun before its code is read;
    either way its code is never seen."""
    return [t for t in order if t is not first and (t.exit_status is None or t.exit_status.stopped)
            and t.exit_t is not None and first.exit_t is not None
            and 0 <= t.exit_t - first.exit_t < PEER_LOSS_WINDOW]


def _either(state: State, first: Track, unsure: list[Track], order: list[Track]) -> Diagnosis:
    """The evidence names no single rank: say so, and name the ranks it leaves."""
    def ranks(tracks: list[Track], one: str, many: str) -> str:
        names = ", ".join(f"{t.view.label} on {t.view.node}" for t in tracks)
        return f"{names} {one if len(tracks) == 1 else many}" if tracks else ""
    stopped = ranks([t for t in unsure if t.exit_status is not None], "was stopped by torchrun",
                    "were stopped by torchrun")
    unread = ranks([t for t in unsure if t.exit_status is None], "was reaped by torchrun before its code was read",
                   "were reaped by torchrun before their codes were read")
    went = (f"died first ({first.view.exit}), as a rank dies when it loses a Gloo peer" if first.exit_status is not None
            else "went first, its exit code collected by torchrun before it could be read")
    summary = (f"{first.view.label} on {first.view.node} {went}; {' and '.join(p for p in (stopped, unread) if p)} "
               f"within a second, before {'its' if len(unsure) == 1 else 'their'} own exit could be seen: "
               f"the rank that left first is one of these" + _the_rest(state, first, order, "exits:"))
    causes = ("one of them failed on its own (an exception, sys.exit): its output says which (ddp-preflight "
              "--launch keeps a log per node); the others lost their Gloo peer or were stopped by torchrun",)
    tracks = [first, *unsure]
    return Diagnosis(Kind.EXITED, summary + _notes(state, tracks),
                     tuple(sorted(t.view.rank for t in tracks if t.view.rank is not None)), causes)


def _diagnose(state: State, waiting: float, now: float, wall: float, out: list) -> None:
    threshold = state.config.threshold
    if any(t.view.state is S.EXITED and t.exit_status is not None and t.exit_status.stopped
           and t.gone_at is not None and now - t.gone_at < 2 * threshold for t in state.ranks.values()):
        return      # someone is stopping the run (Ctrl-C, the launcher): not a hang to name
    states = {t.key: _classify(state, t, now) for t in state.ranks.values()}
    found = diagnose(states)
    found = _without_stacks(state, found, states, now) or found
    found = _rendezvous(state, found, states) or found
    flowing = [n.name for n in state.nodes.values() if (n.net_bytes_per_s or 0) > FLOWING]
    if found.kind is Kind.NETWORK_STALL and flowing:
        found = Diagnosis(Kind.SLOW, f"{found.summary.split(':')[0]}, but data is still flowing on "
                          f"{', '.join(flowing)}: a slow collective, not a hang", found.guilty)
    if found.kind is Kind.NONE:
        return
    if found.kind is Kind.STRAGGLER and waiting >= state.config.endless:
        found = _endless(state, found, states, waiting) or found
    if found.kind is Kind.STRAGGLER:
        found = replace(found, summary=found.summary + _wait_share(state, states))
    elif found.kind in (Kind.DEADLOCK, Kind.MISMATCH, Kind.NETWORK_STALL):
        found = replace(found, summary=found.summary + _flight_note(state))
    evidence = [f"{_label(k)}: {s.describe()} ({'; '.join(s.evidence)})" for k, s in sorted(states.items())]
    _report(state, found, waiting, wall, out, evidence)


def _endless(state: State, found: Diagnosis, states: dict, waiting: float) -> Diagnosis | None:
    """A straggler that never arrives: its peers have waited `endless` seconds while it computes.
    Compiling, saving and loading data may take that long and arrive: only computing counts."""
    working = {k: s for k, s in states.items() if k in found.guilty}
    if not working or any(s.state not in (S.COMPUTING, S.RUNNING) for s in working.values()):
        return None
    waiting_ranks = {k: s for k, s in states.items() if s.state in (S.COLLECTIVE, S.GPU_WAIT)}
    who = "; ".join(f"{_label(k)} has computed for {waiting:.0f} s at "
                    f"{s.frame.where + ' (' + s.frame.function + ')' if s.frame else 'an unknown line'}"
                    for k, s in sorted(working.items()))
    tracks = [t for t in state.ranks.values() if t.key in working]
    ops = "/".join(sorted({str(s.op) for s in waiting_ranks.values()}))
    return Diagnosis(Kind.ENDLESS, f"{who} and never reaches {ops or 'the collective'}, where "
                     f"{_label_list(sorted(waiting_ranks))} wait{'s' if len(waiting_ranks) == 1 else ''} "
                     f"(over {state.config.endless:.0f} s: a straggler would have arrived)" + _notes(state, tracks),
                     found.guilty, ENDLESS_CAUSES)


def _notes(state: State, tracks: list[Track]) -> str:
    """What preflight said of these ranks' nodes (under --launch): the data-shards warning of the
    node whose loader never ends is the clue."""
    said = [f"{node}: {note}" for node in dict.fromkeys(t.view.node for t in tracks)
            for note in state.config.notes.get(node, ())]
    return f"; preflight said of {'; '.join(said)}" if said else ""


def _label_list(keys: list[int]) -> str:
    numbered = [k for k in keys if k >= 0]
    return ("rank " if len(numbered) == 1 else "ranks ") + ",".join(map(str, numbered)) if numbered else "the others"


def _flight_note(state: State) -> str:
    """From the ranks' Flight Recorders (every rank under --launch; under attach, those that opted
    in): where each one is in the sequence of collectives ("ranks 0,2 at all_reduce #1235, rank 1
    at all_reduce #1234")."""
    at: dict[tuple, list[int]] = {}
    for t in state.ranks.values():
        groups = (t.view.flight or {}).get("groups") or []
        main = next((g for g in groups if g["group"] == "default_pg"), groups[0] if groups else None)
        if main is not None and t.view.rank is not None:
            at.setdefault((main["seq"], main["op"]), []).append(t.view.rank)
    if not at:
        return ""
    parts = [f"{'rank' if len(rs) == 1 else 'ranks'} {','.join(map(str, sorted(rs)))} at {op} #{seq}"
             for (seq, op), rs in sorted(at.items(), key=lambda kv: (-len(kv[1]), kv[0][0] or 0))]
    return "; Flight Recorder: " + ", ".join(parts)


def _wait_share(state: State, states: dict) -> str:
    """How much of the recent past the waiting ranks spent idle: the straggler's cost."""
    shares = [sum(c < stall.IDLE_CPU for c in t.view.history[-30:]) / len(t.view.history[-30:])
              for t in state.ranks.values()
              if t.view.history and states.get(t.key) is not None and states[t.key].state is S.COLLECTIVE]
    if not shares:
        return ""
    span = min(30, max(len(t.view.history) for t in state.ranks.values()))
    return f"; the waiting ranks were idle {sum(shares) / len(shares):.0%} of the last {span} s"


def _report(state: State, found: Diagnosis, waiting: float, wall: float, out: list,
            evidence: list[str] | None = None) -> None:
    state.diagnosis = found.as_reported(round(wall - waiting, 3), evidence or [])
    said = f"{found.kind.value}:{found.guilty}"
    if said == state.reported:
        return
    state.reported = said
    snap = snapshot(state, wall)
    if found.kind.is_hang:
        out.append(Say(Event("diagnosis", f"{found.kind.value.upper()}: {found.summary}", snap)))
        out.append(WriteBundle(snap, details(state)))
    else:
        out.append(Say(Event("straggler" if found.kind is Kind.STRAGGLER else "notice", found.summary, snap)))


def _without_stacks(state: State, found: Diagnosis, states: dict, now: float) -> Diagnosis | None:
    """Stacks missing for some rank (no ptrace, no py-spy), yet every rank is watched and none has
    used CPU: the run is stalled, though who is guilty cannot be told. A rank on a lost node, or
    one using CPU, may be a straggler: then it stays `unseen`, not a hang."""
    unknown = [k for k, s in states.items() if s.state is S.UNKNOWN]
    if not unknown or found.kind not in (Kind.NONE, Kind.UNSEEN):
        return None
    live = [t for t in state.ranks.values() if t.view.state is not S.EXITED]
    if not live or not all(state.nodes[t.view.node].status is NodeStatus.WATCHING and t.idle_since is not None
                           for t in live):
        return None
    quiet = min(now - t.idle_since for t in live if t.idle_since is not None)
    idle = [k for k, s in states.items() if s.state is not S.EXITED]
    return Diagnosis(Kind.STALL, f"{', '.join(_label(k) for k in sorted(idle))} have used "
                     f"no CPU for {quiet:.0f}+ s; stacks unavailable for "
                     f"{', '.join(_label(k) for k in sorted(unknown))}, so who is guilty cannot be told "
                     "(see the notice for the fix)")


def _label(key: int) -> str:
    return f"rank {key}" if key >= 0 else f"pid {-key}"


# -- rendezvous: who never checked in --------------------------------------------------------

def _rendezvous(state: State, found: Diagnosis, states: dict) -> Diagnosis | None:
    """Ranks wait in init_process_group: what their store said since they began to wait (the
    agents read it with their stacks) names who never checked in, and the node it belongs to."""
    if found.kind not in (Kind.RENDEZVOUS_STALL, Kind.NONE):
        return None
    stuck = [t for t in state.ranks.values() if t.key in states and states[t.key].state is S.RENDEZVOUS]
    began = min((t.idle_since for t in stuck if t.idle_since is not None), default=None)
    answers = [state.stores.get(t.info.master if t.info else None) for t in stuck]
    fresh = [said for said, at in filter(None, answers) if began is None or at >= began]
    nodes = {**state.config.planned, **{t.view.rank: t.view.node for t in state.ranks.values() if t.view.rank is not None}}
    return rendezvous_stall(states, fresh[0] if fresh else None, nodes)


# -- ranks that never talk -------------------------------------------------------------------

def _connections(state: State, node: str, msg: protocol.Sample, now: float, wall: float, out: list) -> None:
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
            text = connected_late(sorted(t.key for t in late))
            _remember(state, text)
            out.append(_say("notice", text, alone=False))
        return
    live = [t for t in state.ranks.values() if t.view.state is not S.EXITED]
    world = [t for t in live if (t.view.world_size or 0) > 1]
    if not world or len(world) < len(live) or \
            any(state.nodes[t.view.node].status is not NodeStatus.WATCHING for t in world):
        return
    alone = [t for t in world if t.alone_since is not None and now - t.alone_since >= ALONE_AFTER
             and t.busy_at is not None and t.busy_at >= t.alone_since]
    if len(alone) < len(world):
        return
    seconds = min(now - t.alone_since for t in alone if t.alone_since is not None)
    found = trains_alone(sorted(t.key for t in alone), max(t.view.world_size or 0 for t in alone), seconds)
    state.alone = tuple((t.view.node, t.view.pid) for t in alone)
    if state.diagnosis is None:
        state.diagnosis = found.as_reported(round(wall - seconds, 3), [
            f"{t.view.label} on {t.view.node}: no TCP connection for {now - (t.alone_since or now):.0f} s, "
            f"CPU {t.view.cpu:.0f}%" for t in alone])
    _remember(state, found.summary)
    out.append(Say(Event("notice", found.summary, snapshot(state, wall), {"alone": True})))
