"""Under `--launch`, the probes that need torch inside the training's own ranks (issue 36): one
torchrun, one torch import and one rendezvous for the probes and the training, where a probe job
of its own paid them once more before the training did.

Preflight's shared torch job (preflight/probes/together.py) asks `InRanks` first. Where the
training's plan can carry that job (the same nodes in the same order, as many ranks on each as
the job needs; compute with a thread count of its own), InRanks starts the training's launch at
once with the job's options: each rank runs the same parts (node/jobs/probes.py's in_rank)
before the training's code, prints their marked lines, says GATE and waits
(node/rank_bootstrap.py). `Gate` holds every line of the nodes until the master's word: the
parts' lines become each node's result, as from the job's own run, and the rest is shown and
logged once the gate opens. Then preflight's checks judge them as always, and the launcher
either opens the gate (READY: the ranks run the training's code, torch already imported) or
stops the launch (NOT READY: no line of the training's code ran).

Never a lost probe, never a wrong figure: where the plan cannot carry the job, where a rank did
not reach the gate (a part broke its group, a node failed), and for any job after the first (a
second look, a second attempt), the probe runs its own job as before, after this launch has
been stopped (it holds the master port); the launcher then starts the training anew."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable

from ddp_preflight.node import protocol
from ddp_preflight.transport import JobResult

from ..preflight.model import NodeFacts, Options
from ..preflight.probes.job_end import slowdown
from ..preflight.probes.torchjob import TorchJob
from .output import Tee, parse
from .plan import NodePlan, Plan
from .run import Launch

PARTS = (protocol.GATE, protocol.COMPUTE, protocol.COLLECTIVES, protocol.BANDWIDTH, protocol.INTERFERED)
PROBED = "probes-in-ranks.json"    # in the log folder: each rank's pid when it said GATE
STOP_WAIT = 30.0     # seconds for a launch that cannot carry the probes to end (the freeze, the grace)


class Gate:
    """A started launch whose ranks wait for the master's word: every line of its nodes held
    (`held`, the launch's hold) until `open`; the parts' marked lines kept per node."""

    def __init__(self, launch: Launch):
        self.launch = launch
        self.tees = {n.node: Tee() for n in launch.plan.nodes}
        self.parts: dict[str, list[str]] = {n.node: [] for n in launch.plan.nodes}
        self.later: list[tuple[NodePlan, str]] = []       # every other line, shown once the gate opens
        self.waiting = set(launch.ranks)                   # ranks that have not said GATE
        self.errors: dict[int, str] = {}                   # a rank's part that raised
        self.pids: dict[int, int] = {}                     # each rank's process, as it said GATE
        self.opened = False
        self.changed = threading.Condition()
        self.started = time.monotonic()                    # the launch starts now
        self.seconds: dict[str, float] = {}                # node -> until its last rank said GATE
        launch.hold = self.held
        launch.on_end.append(lambda _result: self._wake())

    def held(self, node: NodePlan, raw: str) -> bool:
        with self.changed:
            if self.opened:
                return False
            for whole in self.tees[node.node].feed(raw):
                line = parse(node.node, node.first_rank, whole, time.time())
                if line.rank in node.ranks and line.text.startswith(PARTS):
                    self.parts[node.node].append(line.text)
                    if line.text.startswith(protocol.GATE):
                        said = protocol.parse(line.text, protocol.GATE)
                        self.waiting.discard(line.rank)
                        if isinstance(said, dict) and said.get("error"):
                            self.errors[line.rank] = str(said["error"])
                        if isinstance(said, dict) and isinstance(said.get("pid"), int):
                            self.pids[line.rank] = said["pid"]
                        if not self.waiting & set(node.ranks):
                            self.seconds[node.node] = round(time.monotonic() - self.started, 3)
                else:
                    self.later.append((node, whole))
            self.changed.notify_all()
            return True

    def _wake(self) -> None:
        with self.changed:
            self.changed.notify_all()

    def reached(self, bound: float) -> bool:
        """Whether every rank said GATE with no part broken, within `bound` seconds, its launch running."""
        deadline = time.monotonic() + bound
        with self.changed:
            while self.waiting and not self.launch.done and time.monotonic() < deadline:
                self.changed.wait(min(1.0, max(0.0, deadline - time.monotonic())))
            return not self.waiting and not self.errors and not self.launch.done

    def results(self) -> list[JobResult]:
        """Each node's part lines, as the probe job's result on that node (its seconds: until the
        node's last rank waited, as a job's run on the node until its end)."""
        return [JobResult(node=n.node, exit=0, seconds=self.seconds.get(n.node, 0.0), marked=list(self.parts[n.node]),
                          stdout="\n".join(self.parts[n.node])) for n in self.launch.plan.nodes]

    def open(self, log_dir) -> None:
        """READY: the log folder from now on, the lines held shown and logged in their order, then the
        word to every node (node/supervisor.py's "open-gate"): the ranks run the training's code."""
        with self.changed:
            # With which process ran the probes as each rank: the training's own (the lab's test reads it).
            self.launch.keep_logs(log_dir, {PROBED: {"ranks": [{"rank": r, "pid": p} for r, p in sorted(self.pids.items())]}})
            for node, whole in self.later:
                self.launch._one_line(node, whole)     # whole already: past the node's Tee
            self.later, self.opened = [], True
        for job in list(self.launch._jobs.values()):
            try:
                job.send({"cmd": "open-gate"})
            except Exception:
                pass       # the channel is gone: that node's end says so, and the run stops


class InRanks:
    """What together.py asks (`__call__`), once: the shared job's parts in the training's ranks.
    `plan_for(nodes, options)` is the training's plan as the launcher would build it (None: it
    cannot be built yet). After preflight, `gate` is the launch waiting for the word, or None."""

    def __init__(self, cluster, plan_for: Callable[[tuple[NodeFacts, ...], Options], Plan | None],
                 lease: float | None = None):
        self.cluster, self.plan_for, self.lease = cluster, plan_for, lease
        self.asked = False
        self.gate: Gate | None = None
        self.seconds: float | None = None      # from the launch's start until every rank said GATE

    def __call__(self, job: TorchJob, indexes: list[int], nodes: tuple[NodeFacts, ...],
                 options: Options) -> list[JobResult] | None:
        if self.asked:
            return None
        self.asked = True
        # NCCL: its ranks' Flight Recorder is read through torch's own pipe, which would hold the
        # probes' collectives among the training's (rank_bootstrap.py leaves them out of Gloo's).
        plan = self.plan_for(nodes, options) if options.backend == "gloo" else None
        if plan is None or not carries(plan, job, indexes, nodes):
            return None
        launch = Launch(self.cluster, plan, None) if not self.lease else Launch(self.cluster, plan, None, lease=self.lease)
        launch.probes = {"args": list(job.args), "store_token": secrets.token_hex(16)}
        gate = Gate(launch)
        launch.start()
        # As long as the job's own run may take (torchjob.run's bound), and its wait after it.
        if not gate.reached(job.timeout * slowdown(nodes[i] for i in indexes) + 30):
            stop(launch)
            return None
        self.gate, self.seconds = gate, time.monotonic() - gate.started
        return gate.results()

    def ready(self, plan: Plan) -> Gate | None:
        """The launch waiting at its gate, when it runs this plan; else None (any launch of it stopped)."""
        gate, self.gate = self.gate, None
        if gate is None:
            return None
        if gate.launch.plan != plan or gate.launch.done:
            stop(gate.launch)
            return None
        return gate

    def refuse(self) -> None:
        """NOT READY (or the launch is not to run): the ranks stopped at the gate."""
        gate, self.gate = self.gate, None
        if gate is not None:
            stop(gate.launch)


def carries(plan: Plan, job: TorchJob, indexes: list[int], nodes: tuple[NodeFacts, ...]) -> bool:
    """Whether the training's ranks can run the job as its own run would: every node, in the
    plan's order, as many ranks on each as the job starts there; a compute benchmark with its
    own thread count on every node (torch's own default cannot be had again in a rank whose torch
    started with the training's OMP_NUM_THREADS)."""
    if [n.node for n in plan.nodes] != [nodes[i].node for i in indexes] or len(indexes) != len(nodes):
        return False
    if tuple(len(n.ranks) for n in plan.nodes) != tuple(job.counts):
        return False
    args = list(job.args)
    if "--compute" in args:
        specs = json.loads(args[args.index("--compute") + 1])
        if any(not isinstance(s, dict) or not s.get("threads") or s.get("device") == "cuda" for s in specs):
            return False
    return True


def stop(launch: Launch) -> None:
    """Stop a launch whose ranks never ran the training's code, and wait for its end (the master port)."""
    launch.stop("preflight refused the launch")
    launch.wait(STOP_WAIT)
