"""The watcher on the master: an agent on every node, every rank merged into one view, a hang
named when progress stops. It is the dashboard's Source and feeds the CLI's event stream.

Threads: one reader per agent (messages), one ticker (stall logic, at 4 Hz). All state is
behind one lock; the snapshot is a copy."""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import stall
from .classify import BUSY_CPU, RankState, classify, frames_of
from .diagnose import Diagnosis, diagnose
from transport import Node, NodeError

from .links import LEASE, AgentLink
from .model import HISTORY, DiagnosisView, NodeView, RankView, Snapshot, Source

HANGS = ("deadlock", "mismatch", "network-stall", "rendezvous-stall", "exited", "stall")
STOPPED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
PEER_LOSS = (1 << 8, signal.SIGABRT)     # how a rank that lost its Gloo peer ends (wait status)
PEER_LOSS_WINDOW = 1.0    # seconds: exits this close to the first failure may be its echo
EXIT_SETTLE = 2.0         # seconds after an exit before the exits are judged: the others follow fast
FLOWING = 256 * 1024      # bytes/s on a node's links: a collective still moving data is slow, not stalled
SILENT_SAMPLES = 5        # an agent reports every sample interval: this many missed, its node is lost
SILENT_FLOOR = 2.0        # seconds: never less, however short the interval
GONE, SILENT = "is gone", "went silent"      # how a node's agent was lost
COPY_WAIT = 30.0          # seconds the watch's end waits for a py-spy still being copied


@dataclass
class Event:
    kind: str            # rank-found | rank-gone | node | diagnosis | straggler | resumed | incident | notice
    text: str
    snapshot: Snapshot | None = None
    data: dict = field(default_factory=dict)


@dataclass
class _Rank:
    view: RankView
    start: int = 0
    idle_since: float | None = None
    info: dict = field(default_factory=dict)
    dump: list | None = None
    dump_error: str | None = None
    stack_at: float | None = None     # when the stack in hand was taken (no earlier than this)
    busy_at: float | None = None      # the last sample that used CPU
    gone_at: float | None = None
    exit_t: float | None = None       # when it exited, the node's clock (epoch s)
    exit_code: int | None = None      # wait status, when the agent caught it


@dataclass(frozen=True)
class WatchTarget:
    node: Node                     # reached through the transport (SSH, or this machine)
    pids: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return self.node.name


class Watcher(Source):
    def __init__(self, targets: list[WatchTarget], *, threshold: float = stall.DEFAULT_THRESHOLD,
                 interval: float = 1.0, native: bool = False, py_spy: str | None = None,
                 on_event: Callable[[Event], None] | None = None, on_hang: Callable[[str], None] | None = None,
                 incident_dir: str = "hangwatch-incidents", lease: float = LEASE,
                 clock: Callable[[], float] = time.monotonic):
        self.clock = clock           # monotonic seconds; tests replaying recorded agent lines drive it
        self.targets, self.threshold, self.interval = list(targets), threshold, interval
        self.native, self.py_spy, self.lease = native, py_spy, lease
        self.on_event, self.on_hang = on_event or (lambda e: None), on_hang
        self.incident_dir = incident_dir
        self.lock = threading.RLock()
        self.nodes = {t.name: NodeView(t.name) for t in targets}
        self.hello: dict[str, dict] = {}
        self.ranks: dict[tuple[str, int], _Rank] = {}
        self.links: dict[str, AgentLink] = {}
        self.diagnosis: DiagnosisView | None = None
        self.incidents: list[str] = []
        self.messages: list[str] = []
        self._asked: dict[str, float] = {}           # node -> when stacks were asked, outstanding
        self._asked_at: float | None = None
        self._reported: str | None = None            # the diagnosis already said in this stall
        self._exit_check_at: float | None = None     # look at the exits once they have settled
        self.silent_after = max(SILENT_SAMPLES * interval, SILENT_FLOOR)
        self._heard: dict[str, float] = {}           # node -> when its agent last said anything
        self._lost: dict[str, str] = {}              # node -> how its agent was lost (GONE, SILENT)
        self._bringing: list[threading.Thread] = []
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    # --- life -----------------------------------------------------------------------------
    def start(self) -> Watcher:
        for target in self.targets:
            link = AgentLink(target.node, self._message, self._closed)
            spec = {"node": target.name, "interval": self.interval, "pids": list(target.pids), "lease": self.lease,
                    "native": self.native, "py_spy": self.py_spy or (local_py_spy() if target.node.is_local else None)}
            try:
                link.start(spec)
            except Exception as exc:
                self._node(target.name, "error", f"{target.name}: the agent did not start with {target.node.python}: "
                           f"{exc}; fix: --python PATH, the training environment's Python, runnable by this user")
                continue
            self.links[target.name] = link
        self._ticker = threading.Thread(target=self._tick_loop, daemon=True)
        self._ticker.start()
        return self

    def close(self) -> None:
        self._stop.set()
        for link in self.links.values():
            link.close()
        if self._ticker:
            self._ticker.join(2)
        for thread in self._bringing:
            thread.join(COPY_WAIT)

    # --- Source -----------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        with self.lock:
            return Snapshot(time=time.time(), threshold=self.threshold,
                            nodes=[replace(n) for n in self.nodes.values()],
                            ranks=sorted((replace(r.view, history=list(r.view.history)) for r in self.ranks.values()),
                                         key=lambda v: (v.rank is None, v.rank if v.rank is not None else 0, v.node, v.pid)),
                            diagnosis=replace(self.diagnosis) if self.diagnosis else None,
                            incidents=list(self.incidents), messages=list(self.messages[-20:]))

    def dump_stacks(self) -> None:
        self._ask_stacks()

    def write_bundle(self) -> str | None:
        from .incident import write
        snap = self.snapshot()
        path = write(snap, self.details(), self.incident_dir)
        with self.lock:
            self.incidents.append(path)
        return path

    def details(self) -> dict:
        """What an incident bundle keeps beyond the snapshot: each node's agent hello (versions)
        and each rank's environment (secrets redacted) and command line."""
        with self.lock:
            return {"nodes": dict(self.hello),
                    "ranks": {f"{n}:{p}": {"argv": r.info.get("argv"), "env": r.info.get("env"),
                                           "master": r.info.get("master")}
                              for (n, p), r in self.ranks.items()}}

    # --- messages from agents ----------------------------------------------------------------
    def _emit(self, kind: str, text: str, snapshot: bool = False, **data) -> None:
        self.on_event(Event(kind, text, self.snapshot() if snapshot else None, data))

    def _node(self, name: str, status: str, message: str | None = None, **data) -> None:
        with self.lock:
            node = self.nodes[name]
            node.status, node.message = status, message
            if message:
                self.messages.append(message)
        self._emit("node", message or f"{name}: {status}", node=name, status=status, **data)

    def _message(self, node: str, msg: dict) -> None:
        try:
            self._handle(node, msg)
        except Exception as exc:      # one bad message is a notice; the node stays watched
            self._notice(f"hangwatch: internal error on a message from {node}: {type(exc).__name__}: {exc}")

    def _handle(self, node: str, msg: dict) -> None:
        kind = msg.get("type")
        with self.lock:
            self._heard[node] = self.clock()
            back = self._lost.get(node) == SILENT
            if back:
                del self._lost[node]
        if back:
            self._node(node, "watching", f"{node} watched again: its agent reports again; its ranks' "
                       "stacks are taken afresh", again=True)
            self._ask_stacks()
        if kind == "hello":
            with self.lock:
                self.hello[node] = msg
            self._node(node, "watching", agent_pid=msg.get("pid"))
            if msg.get("py_spy_refused"):
                self._refused_py_spy(node, msg["py_spy_refused"])
            if not msg.get("py_spy"):
                # Copying takes seconds over a slow link: the node's messages keep coming meanwhile.
                thread = threading.Thread(target=self._bring_py_spy, args=(node,), daemon=True)
                self._bringing.append(thread)
                thread.start()
        elif kind == "py-spy":
            if msg.get("refused"):
                self._refused_py_spy(node, msg["refused"])
        elif kind == "rank":
            self._rank_found(node, msg)
        elif kind == "sample":
            self._sample(node, msg)
        elif kind == "stacks":
            self._stacks(node, msg)
        elif kind == "exit":
            self._exit(node, msg)

    def _bring_py_spy(self, node: str) -> None:
        """py-spy is missing on a node: copy ours there (a static binary) for this watch, into a
        folder made for it now that only this user can write (the transport's put_file: a name
        another user could have placed first is never used); the agent removes it at its end."""
        target = next(t for t in self.targets if t.name == node)
        binary = local_py_spy()
        if target.node.is_local or binary is None:
            self._notice(f"{node}: py-spy is not installed for the training Python there, so stacks are "
                         "missing; fix: pip install py-spy in the training environment on that node (CPU "
                         "and /proc are still watched)")
            return
        try:
            path, folder = target.node.put_file(binary, "py-spy", mode=0o700, prefix="hangwatch-")
        except NodeError as exc:      # a full disk, a link gone: say it, watch without stacks
            self._notice(f"{exc.summary}; fix: pip install py-spy in the training environment on that node")
            return
        self.links[node].send({"cmd": "py-spy", "path": path, "remove": folder})
        self._notice(f"{node}: py-spy was missing; copied this machine's to {path} for this watch")

    def _refused_py_spy(self, node: str, why: str) -> None:
        self._notice(f"{node}: the agent did not run the py-spy it was given: {why}; stacks from it are "
                     "missing; fix: pip install py-spy in the training environment on that node")

    def _closed(self, node: str, why: str | None) -> None:
        if self._stop.is_set():
            return
        self._lose(node, GONE, f"{node}: the agent stopped ({why or 'its SSH channel closed'}); "
                   "the other nodes are still watched")

    def _lose(self, node: str, how: str, message: str) -> None:
        """Its ranks are unknown from now on: their stacks and CPU are from before and say nothing
        now, so none of it is judged (a rank nobody sees may be computing)."""
        with self.lock:
            self._lost[node] = how
            for r in self.ranks.values():
                if r.view.node == node and r.view.state != "exited":
                    r.view.state, r.view.op, r.view.frame, r.view.function = "unknown", None, None, None
                    r.view.idle_for, r.idle_since, r.busy_at = 0.0, None, None
                    r.dump, r.dump_error, r.stack_at = None, None, None
            self._asked.pop(node, None)
            if not self._asked:
                self._asked_at = None
        self._node(node, "lost", message)

    def _notice(self, text: str) -> None:
        with self.lock:
            if text in self.messages:
                return
            self.messages.append(text)
        self._emit("notice", text)

    def _rank_found(self, node: str, info: dict) -> None:
        with self.lock:
            # A restarted rank (same rank number, new pid) replaces its old entry.
            for key, r in list(self.ranks.items()):
                if r.view.node == node and info.get("rank") is not None and r.view.rank == info["rank"] \
                        and r.view.pid != info["pid"]:
                    del self.ranks[key]
            view = RankView(node=node, pid=info["pid"], rank=info.get("rank"), local_rank=info.get("local_rank"),
                            world_size=info.get("world_size"))
            self.ranks[(node, info["pid"])] = _Rank(view, info.get("start", 0), info=info)
            self.nodes[node].ranks = sum(1 for r in self.ranks.values() if r.view.node == node)
            env = info.get("env") or {}
            self.nodes[node].interface = env.get("GLOO_SOCKET_IFNAME") or env.get("NCCL_SOCKET_IFNAME") \
                or self.nodes[node].interface
        if not info.get("env_readable", True):
            self._notice(f"{node}: cannot read pid {info['pid']}'s environment (another user's process), so "
                         "its rank is unknown; fix: run hangwatch as the user who runs the training, or as root")
        self._emit("rank-found", f"{node}: found {view.label} (pid {view.pid}"
                   f"{', world ' + str(view.world_size) if view.world_size else ''})",
                   node=node, pid=view.pid, rank=view.rank)

    def _sample(self, node: str, msg: dict) -> None:
        now = self.clock()
        gone = []
        with self.lock:
            self.nodes[node].net_bytes_per_s = msg.get("net")
            for s in msg.get("ranks", []):
                r = self.ranks.get((node, s["pid"]))
                if r is None:
                    continue
                v = r.view
                v.wchan = s.get("wchan")
                if s.get("exit") is not None:       # caught as a zombie, before its exit notice
                    if v.state != "exited":
                        self._exited(r, s["exit"], msg.get("t"))
                        gone.append(v)
                    continue
                if "cpu" not in s:
                    continue
                v.cpu = s["cpu"]
                v.history = (v.history + [s["cpu"]])[-HISTORY:]
                if s["cpu"] < stall.IDLE_CPU:
                    if r.idle_since is None:
                        # Idle over this whole sample, and over the part of the one before that
                        # it did not use: a rank that computes, then blocks, stops mid-sample.
                        before = v.history[-2] if len(v.history) > 1 else 100.0
                        r.idle_since = now - self.interval * (2 - min(before, 100.0) / 100)
                else:
                    r.idle_since, r.busy_at = None, now
                    if v.state in ("idle", "collective", "rendezvous", "unknown") and r.dump is not None:
                        v.state = "running"          # moving again: the old stack no longer says where
                v.idle_for = round(now - r.idle_since, 1) if r.idle_since is not None else 0.0
            for pid in msg.get("gone", []):
                r = self.ranks.get((node, pid))
                if r is not None and r.view.state != "exited":
                    self._exited(r, None, msg.get("t"))
                    gone.append(r.view)
        for v in gone:
            self._emit("rank-gone", f"{node}: {v.label} {v.exit}", node=node, pid=v.pid, rank=v.rank, exit=v.exit)

    def _exited(self, r: _Rank, code: int | None, at: float | None) -> None:
        v = r.view
        v.exit = _exit_text(code)
        v.state, v.cpu, r.idle_since, v.idle_for = "exited", 0.0, None, 0.0
        r.gone_at, r.exit_t, r.exit_code = self.clock(), at, code
        self._exit_check_at = self.clock() + EXIT_SETTLE

    def _exit(self, node: str, msg: dict) -> None:
        """The agent saw the exit the moment it happened (pidfd), with the code if it was quick."""
        with self.lock:
            r = self.ranks.get((node, msg["pid"]))
            if r is None:
                return
            fresh = r.view.state != "exited"
            if fresh or r.exit_code is None:
                self._exited(r, msg.get("code"), msg.get("t"))
        if fresh:
            self._emit("rank-gone", f"{node}: {r.view.label} {r.view.exit}", node=node, pid=r.view.pid,
                       rank=r.view.rank, exit=r.view.exit)

    def _stacks(self, node: str, msg: dict) -> None:
        permission = []
        with self.lock:
            # Asked for: taken after the ask. Taken by the agent on its own: shortly before now.
            taken = self._asked.get(node, self.clock() - 1.0) if msg.get("id") is not None else self.clock() - 1.0
            for pid, dump in (msg.get("stacks") or {}).items():
                r = self.ranks.get((node, int(pid)))
                if r is None or r.view.state == "exited":
                    continue
                r.stack_at = taken
                if isinstance(dump, dict):
                    r.dump, r.dump_error = None, dump.get("error")
                    if dump.get("permission"):
                        permission.append(pid)
                else:
                    r.dump, r.dump_error = dump, None
                self._classify(r)
            for pid, record in (msg.get("flight") or {}).items():
                r = self.ranks.get((node, int(pid)))
                if r is not None:
                    r.view.flight = record
            if msg.get("id") is not None:
                self._asked.pop(node, None)
                if not self._asked:
                    self._asked_at = None
        if permission:
            self._notice(f"{node}: not permitted to read the stacks of pid {', '.join(permission)} (ptrace); "
                         "fix: run hangwatch as the user who runs the training, or as root, or "
                         "`sudo sysctl kernel.yama.ptrace_scope=0`; watching CPU and /proc alone")

    def _classify(self, r: _Rank) -> RankState:
        v = r.view
        if v.state == "exited":
            return RankState("exited", evidence=(v.exit or "exited",))
        if self.nodes[v.node].status in ("lost", "error"):
            # Its stack and CPU are from before the node was lost: they say nothing now.
            v.state, v.op, v.frame, v.function = "unknown", None, None, None
            return RankState("unknown", evidence=(f"not watched: {v.node}'s agent {self._lost.get(v.node, GONE)}",))
        state = classify(r.dump, v.cpu, v.wchan)
        if state.state in ("collective", "rendezvous", "idle") and r.idle_since is None and \
                r.busy_at is not None and r.stack_at is not None and r.busy_at > r.stack_at:
            # It has used CPU since its stack showed it waiting: the stack no longer says where.
            state = RankState("computing" if v.cpu >= BUSY_CPU else "running",
                              evidence=(f"CPU {v.cpu:.0f}%", "working since its last stack"))
        if r.dump is None and r.dump_error:
            state = replace(state, evidence=(f"no stack: {r.dump_error}",))
        v.state, v.op = state.state, state.op
        v.frame = state.frame.where if state.frame else None
        v.function = state.frame.function if state.frame else None
        v.stack = [{"function": f.function, "file": f.file, "line": f.line} for f in frames_of(r.dump)] if r.dump else None
        return state

    # --- stall logic ---------------------------------------------------------------------------
    def _ask_stacks(self) -> None:
        with self.lock:
            self._asked_at = self.clock()
            for name, link in self.links.items():
                command = {"cmd": "stacks", "id": int(self._asked_at * 1000),
                           "native": True if self.native else "auto"}
                if self.nodes[name].status == "watching" and link.send(command):
                    self._asked[name] = self._asked_at
            if not self._asked:
                self._asked_at = None

    def _tick_loop(self) -> None:
        while not self._stop.wait(0.25):
            try:
                self.tick()
            except Exception as exc:      # the watch goes on; say it once
                self._notice(f"hangwatch: internal error in the stall logic: {type(exc).__name__}: {exc}")

    def tick(self) -> None:
        now = self.clock()
        for node, quiet in self._silent(now):
            self._lose(node, SILENT, f"{node} lost: its agent has sent nothing for {quiet:.0f} s (the link or "
                       "the node is down); its ranks are unknown until it reports again; the other nodes "
                       "are still watched")
        step, resumed = None, False
        with self.lock:
            live = [r for r in self.ranks.values() if r.view.state != "exited"]
            exited = [r for r in self.ranks.values() if r.view.state == "exited"]
            idle = [r for r in live if r.idle_since is not None]
            for r in live:
                r.view.idle_for = round(now - r.idle_since, 1) if r.idle_since is not None else 0.0
            first_failure = None
            if self._exit_check_at is not None and now >= self._exit_check_at:
                self._exit_check_at = None
                first_failure = self._first_failure(exited)
            # Progress is seen on watched nodes only: a lost node's ranks are neither idle nor not.
            watched = [r for r in live if self.nodes[r.view.node].status == "watching"]
            if watched and not idle:
                resumed = self.diagnosis is not None and self.diagnosis.kind != "exited"
                if resumed:
                    self.diagnosis, self._reported = None, None
                    self.messages.append("progress resumed")
            elif idle:
                waiting = max(now - r.idle_since for r in idle)
                if exited:
                    # A rank that is gone while others are idle: the stall began when it left.
                    waiting = max(waiting, min(now - r.gone_at for r in exited if r.gone_at is not None)
                                  if any(r.gone_at is not None for r in exited) else 0.0)
                covered = all(r.stack_at is not None and r.stack_at >= r.idle_since for r in idle)
                newest = max((r.stack_at for r in live if r.stack_at is not None), default=None)
                step = stall.plan(waiting, self.threshold, covered,
                                  None if newest is None else now - newest,
                                  None if self._asked_at is None else now - self._asked_at)
        if resumed and live:
            self._emit("resumed", "progress resumed: no rank is idle")
        if first_failure is not None:
            self._report(first_failure, 0.0)
        if step is None:
            return
        if step.take_stacks:
            self._ask_stacks()
        if step.diagnose:
            self._diagnose(waiting)

    def _silent(self, now: float) -> list[tuple[str, float]]:
        """Watched nodes whose agent has said nothing for a few sample intervals, and for how long."""
        with self.lock:
            return [(name, now - self._heard[name]) for name, n in self.nodes.items()
                    if n.status == "watching" and name in self._heard and now - self._heard[name] >= self.silent_after]

    def _first_failure(self, exited: list[_Rank]) -> Diagnosis | None:
        """Ranks exited and one failed: the first to go is the one to look at; the rest
        followed (torchrun stopped its siblings, Gloo peers lost their connections)."""
        # Stopped (SIGTERM, SIGINT, SIGHUP: Ctrl-C, the launcher, a scheduler) is not failed.
        failed = [r for r in exited if r.exit_code not in (None, 0) and (r.exit_code & 0x7F) not in STOPPED]
        if not failed:
            return None
        order = sorted(exited, key=lambda r: (r.exit_t is None, r.exit_t or 0.0))
        # The first that failed. Ranks that lose a Gloo peer raise (exit code 1) or abort
        # (SIGABRT: "terminate called without an active exception"), sometimes before the rank
        # that left has finished exiting; so among failures within a second of the first, one
        # with its own code or signal (sys.exit(3), SIGKILL, SIGSEGV) is the one to look at.
        failed.sort(key=lambda r: (r.exit_t is None, r.exit_t or 0.0))
        soon = [r for r in failed if r.exit_t is not None and failed[0].exit_t is not None
                and r.exit_t - failed[0].exit_t < PEER_LOSS_WINDOW]
        first = next((r for r in soon if r.exit_code not in PEER_LOSS), failed[0])
        then = [f"{r.view.label} ({r.view.exit}, {r.exit_t - first.exit_t:+.2f} s)" for r in order
                if r is not first and r.exit_t is not None and first.exit_t is not None]
        live = [r.view.label for r in self.ranks.values() if r.view.state != "exited"]
        how = "exited first" if first is order[0] else "failed on its own"
        summary = (f"{first.view.label} on {first.view.node} {how} ({first.view.exit})"
                   + (f"; then {', '.join(then)}" if then else "")
                   + (f"; still running: {', '.join(live)}" if live else ""))
        return Diagnosis("exited", summary, (first.view.rank,) if first.view.rank is not None else (),
                         ("the first rank's own error: see its output (ddp-preflight --launch keeps a log "
                          "per node)", "the ranks after it were stopped by torchrun or lost their Gloo peer"))

    def _diagnose(self, waiting: float) -> None:
        with self.lock:
            now = self.clock()
            if any(r.view.state == "exited" and r.exit_code is not None and (r.exit_code & 0x7F) in STOPPED
                   and r.gone_at is not None and now - r.gone_at < 2 * self.threshold for r in self.ranks.values()):
                return      # someone is stopping the run (Ctrl-C, the launcher): not a hang to name
            states = {}
            for r in self.ranks.values():
                key = r.view.rank if r.view.rank is not None else -r.view.pid
                states[key] = self._classify(r)
            found = diagnose(states)
            found = self._without_stacks(found, states) or found
            flowing = [n.name for n in self.nodes.values() if (n.net_bytes_per_s or 0) > FLOWING]
            if found.kind == "network-stall" and flowing:
                found = Diagnosis("slow", f"{found.summary.split(':')[0]}, but data is still flowing on "
                                  f"{', '.join(flowing)}: a slow collective, not a hang", found.guilty)
            if found.kind == "none":
                return
            if found.kind == "straggler":
                found = replace(found, summary=found.summary + self._wait_share(states))
            elif found.kind in ("deadlock", "mismatch", "network-stall"):
                found = replace(found, summary=found.summary + self._flight_note())
            evidence = [f"{self._label(k)}: {s.describe()} ({'; '.join(s.evidence)})" for k, s in sorted(states.items())]
        self._report(found, waiting, evidence)

    def _flight_note(self) -> str:
        """From the Flight Recorder of ranks that opted in: where each one is in the sequence of
        collectives ("ranks 0,2 at all_reduce #1235, rank 1 at all_reduce #1234")."""
        at: dict[tuple, list[int]] = {}
        for r in self.ranks.values():
            groups = (r.view.flight or {}).get("groups") or []
            main = next((g for g in groups if g["group"] == "default_pg"), groups[0] if groups else None)
            if main is not None and r.view.rank is not None:
                at.setdefault((main["seq"], main["op"]), []).append(r.view.rank)
        if not at:
            return ""
        parts = [f"{'rank' if len(rs) == 1 else 'ranks'} {','.join(map(str, sorted(rs)))} at {op} #{seq}"
                 for (seq, op), rs in sorted(at.items(), key=lambda kv: (-len(kv[1]), kv[0][0] or 0))]
        return "; Flight Recorder: " + ", ".join(parts)

    def _wait_share(self, states: dict) -> str:
        """How much of the recent past the waiting ranks spent idle: the straggler's cost."""
        shares = [sum(c < stall.IDLE_CPU for c in r.view.history[-30:]) / len(r.view.history[-30:])
                  for r in self.ranks.values()
                  if r.view.history and states.get(r.view.rank) is not None and states[r.view.rank].state == "collective"]
        if not shares:
            return ""
        return f"; the waiting ranks were idle {sum(shares) / len(shares):.0%} of the last {min(30, max(len(r.view.history) for r in self.ranks.values()))} s"

    def _report(self, found: Diagnosis, waiting: float, evidence: list[str] = ()) -> None:
        with self.lock:
            since = time.time() - waiting
            self.diagnosis = DiagnosisView(found.kind, found.summary, list(found.guilty), list(found.causes),
                                           round(since, 3), list(evidence))
            said = f"{found.kind}:{found.guilty}"
            new = said != self._reported
            self._reported = said
        if not new:
            return
        if found.kind in HANGS:
            self._emit("diagnosis", f"{found.kind.upper()}: {found.summary}", snapshot=True)
            self._incident()
        else:
            self._emit("straggler" if found.kind == "straggler" else "notice", found.summary, snapshot=True)

    def _without_stacks(self, found: Diagnosis, states: dict) -> Diagnosis | None:
        """Stacks missing for some rank (no ptrace, no py-spy), yet every rank is watched and none
        has used CPU: the run is stalled, though who is guilty cannot be told. A rank on a lost
        node, or one using CPU, may be a straggler: then it stays `unseen`, not a hang."""
        unknown = [k for k, s in states.items() if s.state == "unknown"]
        if not unknown or found.kind not in ("none", "unseen"):
            return None
        live = [r for r in self.ranks.values() if r.view.state != "exited"]
        if not live or not all(self.nodes[r.view.node].status == "watching" and r.idle_since is not None
                               for r in live):
            return None
        quiet = min(self.clock() - r.idle_since for r in live if r.idle_since is not None)
        idle = [k for k, s in states.items() if s.state != "exited"]
        return Diagnosis("stall", f"{', '.join(self._label(k) for k in sorted(idle))} have used "
                         f"no CPU for {quiet:.0f}+ s; stacks unavailable for "
                         f"{', '.join(self._label(k) for k in sorted(unknown))}, so who is guilty cannot be told "
                         "(see the notice for the fix)")

    def _label(self, key: int) -> str:
        return f"rank {key}" if key >= 0 else f"pid {-key}"

    def _incident(self) -> None:
        try:
            path = self.write_bundle()
        except OSError as exc:
            self._notice(f"hangwatch: could not write the incident bundle: {exc}")
            return
        self._emit("incident", f"incident bundle: {path}", path=path)
        if self.on_hang:
            self.on_hang(path)


def local_py_spy() -> str | None:
    import shutil
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def _exit_text(status: int | None) -> str:
    if status is None:
        return "exited (its parent collected the exit code)"
    if status & 0x7F:
        return f"signal {status & 0x7F}"
    return f"exit code {status >> 8}"

