"""Start the plan on every node over the connections preflight opened, stream every line back, stop all.

Each node runs torchrun under the job supervisor, in its own process group, bounded by the SSH
channel: stopping a node closes the channel's stdin and the supervisor ends the whole group
(SIGTERM, then SIGKILL after a grace). If this process dies, the connections drop, and the
supervisors do the same; if a node stops hearing from it (a link down), that node stops its part
once the lease runs out: nothing of the run outlives it on any node."""

from __future__ import annotations

import collections
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ddp_preflight.hangwatch.exits import StoppedBy
from ddp_preflight.hangwatch.model import Diagnosis
from ddp_preflight.hangwatch.named import launcher_said, launcher_said_in
from ddp_preflight.hangwatch.tracebacks import ExceptionInfo, Reader
from ddp_preflight.node import protocol
from ddp_preflight.node.protocol import ExitStatus
from ddp_preflight.node.ranks import RUN_VARIABLE
from ddp_preflight.node.redact import redact_json
from ddp_preflight.transport import RunningJob

from .ends import judge
from .launched import NodeRun
from .outcome import LaunchedRank, LaunchResult, NodeState, explain
from .output import Line, NodeLogs, Tee, keep_evidence, parse
from .plan import NodePlan, Plan

NO_LIMIT = 7 * 24 * 3600.0      # the supervisor's bound: a week; the channel is the real one
FREEZE_WAIT = 8.0                # seconds a stop waits for every node's ranks to be frozen (each keeps
                                 # its ranks' Flight Recorders first, within 3 s), before it stops them
DEFAULT_LEASE = 60.0             # seconds a node keeps training without hearing from the master
TAIL = 500                       # lines kept per rank (and per node) for the dashboard's log view


class Launch:
    """One training run across the nodes. `start()` returns at once; lines arrive through the
    `on_line` callbacks (from the nodes' reader threads); `stop()` may be called from anywhere
    (Ctrl-C, the dashboard's quit) and returns at once; `wait()` blocks until every node ended.

    The state is plain data, readable at any time: `plan`, `ranks` (global rank -> LaunchedRank:
    pid, last_line, step, exit), `nodes` (name -> NodeState), `stop_reason`, `tail()`.

    The log folder is not the run: when it cannot be written, `on_logs_failed` hears why, once.

    What it learns of how ranks end goes to hangwatch through callbacks: `on_stopping(node, t, by)`
    when a launcher begins stopping ranks (torchrun on a node, `t` on its clock; or ddp-preflight
    on every node, node None, `t` on this machine's clock), `on_exception(node, rank, exception)`
    when a rank's output holds an exception (hangwatch/tracebacks.py), `on_rank_end(node, rank, pid,
    status)` with torchrun's exit code or signal of each rank."""

    def __init__(self, cluster, plan: Plan, log_dir: str | Path | None = None, *, check_port: bool = True,
                 lease: float = DEFAULT_LEASE):
        self.cluster, self.plan, self.lease = cluster, plan, lease
        # In the environment of what it starts on every node (the launch program, torchrun, the ranks):
        # its watch follows those processes alone (node/ranks.py), never another run's on the node.
        self.run_token = secrets.token_hex(8)
        self.log_dir = Path(log_dir) if log_dir else None
        self.check_port = check_port
        self.on_line: list[Callable[[Line], None]] = []
        self._tees: dict[str, Tee] = {}       # node -> its torchrun --tee stream (launch/output.py)
        self.on_end: list[Callable[[LaunchResult], None]] = []
        self.on_logs_failed: list[Callable[[str], None]] = []
        self.on_stopping: list[Callable[[str | None, float, str], None]] = []
        self.on_exception: list[Callable[[str, int, ExceptionInfo], None]] = []
        self.on_rank_end: list[Callable[[str, int, int | None, ExitStatus], None]] = []
        self._readers: dict[int | tuple[str, str], Reader] = {}   # rank (or a node's launcher) -> its exception
        self.ranks: dict[int, LaunchedRank] = {
            rank: LaunchedRank(rank, n.node, local) for n in plan.nodes for local, rank in enumerate(n.ranks)}
        self.nodes: dict[str, NodeState] = {n.node: NodeState(n.node) for n in plan.nodes}
        self.stop_reason: str | None = None
        self.first_failure: str | None = None
        self.started_at: float | None = None
        self.first_step_at: float | None = None      # when the first "step N" line arrived
        self._notes: dict[str, str] = {}             # what the summary adds, by what it is about
        self._jobs: dict[str, RunningJob] = {}
        self._lock = threading.RLock()
        self._frozen_changed = threading.Condition(self._lock)
        self._frozen: set[str] = set()               # nodes whose ranks are frozen for the stop
        self._done = threading.Event()
        self._result: LaunchResult | None = None
        self._tails: dict[tuple[str, int | None], collections.deque] = {}
        self._logs = NodeLogs(self.log_dir, on_failure=lambda why: self._tell(self.on_logs_failed, why)) \
            if self.log_dir else None
        # The probes in the ranks, and the hold on the nodes' lines until the master's word (in_ranks.py).
        self.probes: dict | None = None
        self.hold: Callable[[NodePlan, str], bool] | None = None

    # -- control --------------------------------------------------------------------------------
    def start(self) -> None:
        self.started_at = time.time()
        self.keep_logs(self.log_dir)
        for index, node in enumerate(self.plan.nodes):
            with self._lock:
                if self.stop_reason is not None:     # a node already failed: start no more
                    self.nodes[node.node].status = NodeRun.NOT_STARTED
                    self._ended(node, None)
                    continue
                spec = {"program": "launch", "cwd": node.cwd, "module": self.plan.command.module,
                        "flight_recorder": self.plan.flight_recorder, "torchrun": list(node.torchrun),
                        "torch_pip": node.torch_pip, "data_dir": node.data_dir,
                        **({"probes": self.probes} if self.probes else {})}
                try:
                    env = {**node.env, RUN_VARIABLE: self.run_token}     # its processes, told from others'
                    job = self.cluster.job(index, spec, env=env, timeout=NO_LIMIT, lease=self.lease,
                                           on_line=lambda raw, n=node: self._line(n, raw))
                except Exception as exc:    # the connection is gone: this node's error, then stop all
                    state = self.nodes[node.node]
                    state.status, state.error = NodeRun.ERROR, f"could not start: {type(exc).__name__}: {exc}"
                    self._ended(node, None)
                    continue
                self._jobs[node.node] = job
                self.nodes[node.node].status = NodeRun.RUNNING
            threading.Thread(target=self._watch, args=(node, job), daemon=True,
                             name=f"launch-{node.node}").start()

    def keep_logs(self, log_dir: str | Path | None, documents: dict[str, dict] | None = None) -> None:
        """The log folder from now on (at the start; behind the gate, once open): the plan, each node's command."""
        if log_dir is not None and self._logs is None:
            self.log_dir = Path(log_dir)
            self._logs = NodeLogs(self.log_dir, on_failure=lambda why: self._tell(self.on_logs_failed, why))
        if self._logs:
            for name, document in {"plan.json": self.plan.to_json(), **(documents or {})}.items():
                self._logs.write_json(name, document)
            for n in self.plan.nodes:
                self._logs.write(n.node, f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} on {n.node}: "
                                         f"{n.command_line()}")

    def stop(self, reason: str = "stopped") -> None:
        """Stop every node still running; the first reason given is the one reported. Returns at
        once; the stop goes on in a thread of its own, in two steps: every node first keeps its
        ranks' Flight Recorders and freezes its ranks ("prepare-stop"), then, once all are frozen
        (or FREEZE_WAIT passed), every node is stopped. No rank sees a peer die before its own stop
        reaches it: each ends by the stop's signal, not as a failure on a lost peer."""
        stopping_at = time.time()
        with self._lock:
            first = self.stop_reason is None
            if first:
                self.stop_reason = reason
            asked = []
            for name, job in self._jobs.items():
                state = self.nodes[name]
                if state.ended_at is None and not state.stopped:
                    state.stopped = True
                    asked.append((name, job))
        if first:
            self._tell(self.on_stopping, None, stopping_at, StoppedBy.DDP_PREFLIGHT)
        if asked:
            threading.Thread(target=self._stop_nodes, args=(asked,), daemon=True, name="launch-stop").start()

    def _stop_nodes(self, asked: list[tuple[str, RunningJob]]) -> None:
        frozen = []
        for name, job in asked:
            try:
                if job.send({"cmd": "prepare-stop"}):
                    frozen.append(name)
            except Exception:
                pass        # the channel is gone: its supervisor stops the group itself
        deadline = time.monotonic() + FREEZE_WAIT
        with self._frozen_changed:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or all(n in self._frozen or self.nodes[n].ended_at is not None for n in frozen):
                    break
                self._frozen_changed.wait(left)
        for _name, job in asked:
            try:
                job.stop()
            except Exception:
                pass    # the channel is already gone: its supervisor stops the group itself

    def wait(self, timeout: float | None = None) -> LaunchResult | None:
        """The result once every node has ended; None if `timeout` passed first."""
        if not self._done.wait(timeout):
            return None
        return self._result

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def tail(self, node: str, rank: int | None = None, lines: int = 200) -> list[str]:
        """The last lines of one rank, or of the node's own output (rank None)."""
        with self._lock:
            return list(self._tails.get((node, rank), ()))[-lines:]

    def note(self, about: str, text: str | None) -> None:
        """A line the summary adds under its headline (hangwatch's word on the run), or none."""
        with self._lock:
            if text is None:
                self._notes.pop(about, None)
            else:
                self._notes[about] = text

    def rank_pids(self) -> dict[str, dict[int, int]]:
        """node -> {global rank: pid}, for the ranks started so far (hangwatch attaches to these)."""
        out: dict[str, dict[int, int]] = {}
        for r in self.ranks.values():
            if r.pid is not None:
                out.setdefault(r.node, {})[r.rank] = r.pid
        return out

    # -- the nodes' threads ---------------------------------------------------------------------
    def _line(self, node: NodePlan, raw: str) -> None:
        # A marked line here is the node's own: transport.Program took it only with the launch
        # program's signature (a rank's forgery arrives as text, shown as the node's line).
        if raw.startswith(protocol.JOB):
            return                        # the supervisor's outcome: the job's result has it
        if raw.startswith(protocol.LAUNCH):
            data = protocol.parse(raw, protocol.LAUNCH)
            if isinstance(data, dict):
                self._marker(node, data)
            return
        if self.hold is not None and self.hold(node, raw):
            return
        for whole in self._tee(node).feed(raw):
            self._one_line(node, whole)

    def _launcher_line(self, node: NodePlan, text: str) -> None:
        """A line of torchrun's own: what it names, for the one judge (named.by_launchers). Lock held."""
        said, state = launcher_said(self._readers.setdefault(("launcher", node.node), Reader()).feed(text), text), \
            self.nodes[node.node]
        state.said += [said] if said is not None and said not in state.said else []

    def _tee(self, node: NodePlan) -> Tee:
        tee = self._tees.get(node.node)
        if tee is None:
            tee = self._tees[node.node] = Tee()
        return tee

    def _one_line(self, node: NodePlan, raw: str) -> None:
        line = parse(node.node, node.first_rank, raw, time.time())
        if line.rank is None and not line.text.strip():
            return
        seen = None
        with self._lock:
            rank = self.ranks.get(line.rank) if line.rank is not None else None
            if rank is not None:
                rank.last_line = line.text
                step = line.step
                if step is not None:
                    rank.step = step
                    if self.first_step_at is None:
                        self.first_step_at = line.time
                seen = self._readers.setdefault(rank.rank, Reader()).feed(line.text)
                if seen is not None:
                    rank.error = seen
                    # Read on the master after its own stop began: a lost peer then is the stop's.
                    rank.error_after_stop = self.stop_reason is not None
            if line.rank is None:
                self._launcher_line(node, line.text)
            self._tails.setdefault((node.node, line.rank), collections.deque(maxlen=TAIL)).append(line.text)
        if seen is not None and rank is not None:
            self._tell(self.on_exception, node.node, rank.rank, seen)
        if self._logs:
            self._logs.write(node.node, line.prefixed())
        for callback in list(self.on_line):
            try:
                callback(line)
            except Exception:
                pass     # a broken viewer must not stop the reading of a node's output

    def _marker(self, node: NodePlan, data: dict) -> None:
        if data.get("kind") in ("flight", "error_file"):      # a rank's evidence, for explain
            if self._logs and isinstance(data.get("local_rank"), int) and self._global(node, data) in node.ranks:
                keep_evidence(self._logs, node.node, self._global(node, data), data)
            return
        with self._lock:
            state = self.nodes[node.node]
            if data.get("kind") == "error":
                state.error, state.fix = data.get("message"), data.get("fix")
                said = launcher_said_in(str(state.error or ""))     # torch's words in it, for the one judge
                state.said += [said] if said is not None and said not in state.said else []
                return
            if data.get("kind") == "started":
                state.launched, state.watched = True, bool(data.get("watched"))
                return
            if data.get("kind") == "frozen":
                self._frozen.add(node.node)
                self._frozen_changed.notify_all()
                return
            stopping = data.get("kind") == "stopping" and isinstance(data.get("t"), (int, float))
            if stopping:
                # torchrun began stopping the node's ranks still running (one of them ended).
                for entry in data.get("ranks", []):
                    r = self.ranks.get(self._global(node, entry))
                    if r is not None:
                        r.stopped_by = r.stopped_by or StoppedBy.TORCHRUN
                for local in data.get("failed", []):
                    r = self.ranks.get(self._global(node, {"local_rank": local})) if isinstance(local, int) else None
                    if r is not None:
                        r.failed_first = True       # it ended by itself before any stop reached its node
            ended = []
            for entry in [] if stopping else data.get("ranks", []):
                r = self.ranks.get(self._global(node, entry))
                if r is None:
                    continue
                r.pid = entry.get("pid", r.pid)
                if data.get("kind") == "exits":
                    r.exit, r.signal = entry.get("exit"), entry.get("signal")
                    if r.ended:
                        ended.append(r)
        if stopping:
            self._tell(self.on_stopping, node.node, float(data["t"]), StoppedBy.TORCHRUN)
        for r in ended:
            status = ExitStatus(code=r.exit) if r.exit is not None else ExitStatus(signal=r.signal)
            self._tell(self.on_rank_end, r.node, r.rank, r.pid, status)

    def _global(self, node: NodePlan, entry: dict) -> int:
        """A marker's rank entry's global rank (the node's first rank + its local rank, as torchrun numbers them)."""
        rank = entry.get("rank")
        return rank if rank is not None else node.first_rank + entry["local_rank"]

    @staticmethod
    def _tell(callbacks: list, *args) -> None:
        for callback in list(callbacks):
            try:
                callback(*args)
            except Exception:
                pass     # a broken listener must not stop the run

    def _watch(self, node: NodePlan, job) -> None:
        result = job.wait()
        for rest in self._tee(node).rest():      # a rank's last line, never ended
            self._one_line(node, rest)
        with self._lock:
            state = self.nodes[node.node]
            state.exit, state.signal = result.exit, result.signal
            if result.error and not state.error:
                state.error = f"{result.error}" + (f": {result.stderr.strip().splitlines()[-1]}"
                                                   if result.stderr.strip() else "")
            failed = state.error is not None or result.exit != 0
            state.status = (NodeRun.STOPPED if state.stopped else NodeRun.ERROR if state.error
                            else NodeRun.FAILED if failed else NodeRun.EXITED)
            self._ended(node, result)
        if failed and not state.stopped:
            self.stop(f"{node.node} failed")

    def _ended(self, node: NodePlan, result) -> None:
        """Called with the lock held, once per node."""
        state = self.nodes[node.node]
        state.ended_at = time.time()
        self._frozen_changed.notify_all()        # a stop waiting for it to freeze waits no more
        failed = state.status in (NodeRun.FAILED, NodeRun.ERROR)
        if failed and self.first_failure is None and not state.stopped and self.stop_reason is None:
            self.first_failure = node.node
        explain([self.ranks[r] for r in node.ranks], state)
        if all(s.ended_at is not None for s in self.nodes.values()):
            threading.Thread(target=self._finish, daemon=True, name="launch-finish").start()

    def _finish(self) -> None:
        port_free = self._port_free() if self.check_port else None
        with self._lock:
            result = LaunchResult(
                ranks=[self.ranks[r] for r in sorted(self.ranks)], nodes=list(self.nodes.values()),
                stop_reason=self.stop_reason, first_failure=self.first_failure,
                seconds=time.time() - (self.started_at or time.time()),
                log_dir=str(self.log_dir) if self.log_dir else None, port_free=port_free,
                notes=list(self._notes.values()), logs_error=self._logs.failure if self._logs else None)
            # The launcher's own verdict on the ends it saw, until hangwatch gives its own (add_verdict).
            result.verdict, result.judged = (None if result.ok else judge(result.ranks, result.nodes)), True
        if self._logs:
            self._logs.write_json("result.json", redact_json(result.to_json()))
            self._logs.close()
            result.logs_error = self._logs.failure
        self._result = result
        for callback in list(self.on_end):
            try:
                callback(result)
            except Exception:
                pass
        self._done.set()

    def add_verdict(self, verdict: Diagnosis | None) -> None:
        """hangwatch's verdict on the run (who failed first, or the hang it named; None: nothing
        failed), once the run is over: it replaces the launcher's own, in the result and in its
        result.json (what `ddp-preflight explain` of the log folder reports)."""
        if self._result is None:
            return
        changed = verdict != self._result.verdict
        self._result.verdict, self._result.judged = verdict, True
        if self._logs and changed:
            self._logs.write_json("result.json", redact_json(self._result.to_json()))

    def _port_free(self) -> bool | None:
        """Can the master port be bound on the master now? (None: could not ask.)"""
        try:
            job = self.cluster.job(0, {"program": "bind-check", "address": "", "port": self.plan.master_port},
                                   timeout=15)
            result = job.wait(30)
        except Exception:
            return None
        if result.error:
            return None
        return result.exit == 0
