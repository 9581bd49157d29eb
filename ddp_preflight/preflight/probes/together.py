"""The probes that need torch, in one torch job per node (node/jobs/probes.py), every node at once:
each torch import costs seconds here, and compute, collectives and bandwidth were three jobs, the
compute one node by node (issue 36).

Each of those probes runs as before, in a thread of its own, and asks `Together` for its first
job (`run`) or says it needs none (`done`, a skip). Once every one has asked or declined, one job
starts with the parts asked for, and each probe gets the nodes' results to read its own marked
lines from, as from its own job. A part the shared job could not carry (ranks per node that do
not fit, other nodes) and a part that printed nothing there (bandwidth after the collectives broke the group, compute where
the job never started) get None: that probe then runs its own job, as before. Every other job
of these probes (a second look, a second attempt) runs alone too: `serial` keeps them one at a
time, as the master port and the figures need.

Under --launch the shared job may be the training's own torchrun (`in_ranks`, launch/in_ranks.py):
the same parts, run in its ranks before the training's code; where it cannot carry them, the
job runs as above."""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import dataclass, field

from ddp_preflight.node import protocol
from ddp_preflight.transport import JobResult

from ..model import NodeFacts, Options
from . import torchjob

MEMBERS = ("compute", "collectives", "bandwidth")
MARKERS = {"compute": protocol.COMPUTE, "collectives": protocol.COLLECTIVES, "bandwidth": protocol.BANDWIDTH}


@dataclass(frozen=True)
class Part:
    """What one probe asks of the shared job."""
    indexes: tuple[int, ...]                   # the nodes, in node-rank order
    counts: tuple[int, ...] = ()               # ranks it needs on each of those nodes (compute: one, local rank 0)
    args: tuple[str, ...] = ()                 # its job's options (collectives, bandwidth)
    timeout: float = 60.0
    extra_env: dict = field(default_factory=dict)
    specs: tuple[dict | None, ...] = ()        # compute: the benchmark's spec per node, in node-rank order


class Together:
    def __init__(self, cluster, nodes: tuple[NodeFacts, ...], options: Options, members, in_ranks=None):
        self.cluster, self.nodes, self.options = cluster, nodes, options
        # Under --launch: (job, indexes, nodes, options) -> the nodes' results of the same parts run
        # inside the training's own ranks (launch/in_ranks.py), or None where they cannot be.
        self.in_ranks = in_ranks
        self.waiting = set(members)
        self.asked: dict[str, Part] = {}
        self.given: dict[str, list[JobResult] | None] = {}
        self.fired = False
        self.changed = threading.Condition()
        self.lock = threading.Lock()           # one job of these probes at a time

    def run(self, member: str, part: Part) -> list[JobResult] | None:
        """The results of the shared job for this part, or None: run your own (under `serial`)."""
        with self.changed:
            if self.fired or member not in self.waiting:
                return None
            self.asked[member] = part
            self.waiting.discard(member)
            if self.waiting:
                while not self.fired:
                    self.changed.wait()
                return self.given.get(member)
        self._fire()
        return self.given.get(member)

    def done(self, member: str) -> None:
        """This probe needs no shared job (it skipped, or it has its results)."""
        with self.changed:
            if member not in self.waiting:
                return
            self.waiting.discard(member)
            if self.waiting or self.fired:
                return
        self._fire()

    def _fire(self) -> None:
        """Runs in the thread of the last one to ask or decline; gives every asker its answer."""
        given: dict[str, list[JobResult] | None] = {}
        try:
            with self.lock:
                given = self._shared(dict(self.asked))
        finally:
            with self.changed:
                self.given, self.fired = given, True
                self.changed.notify_all()

    def _shared(self, asked: dict[str, Part]) -> dict[str, list[JobResult] | None]:
        carried = fitting(asked)
        job = shared_job(asked, carried)
        if job is None:              # compute alone: its own program is a torch job already
            return {}
        env = {k: v for m in carried for k, v in asked[m].extra_env.items()}
        indexes = list(asked[next(m for m in carried if m != "compute")].indexes)
        results = self.in_ranks(job, indexes, self.nodes, self.options) if self.in_ranks is not None else None
        if results is None:
            results = torchjob.run(self.cluster, self.nodes, self.options, job, indexes=indexes, extra_env=env)
        return {m: results if printed(results, m) else None for m in carried}


def shared_job(asked: dict[str, Part], carried: list[str]) -> torchjob.TorchJob | None:
    """The one job that carries these parts (fitting's), or None where no part needs torch's
    ranks: on each node as many ranks as the most any part needs there."""
    torch_parts = [m for m in carried if m != "compute"]
    if not torch_parts:
        return None
    counts = tuple(max(per_node) for per_node in zip(*(asked[m].counts for m in torch_parts), strict=True))
    args: list[str] = []
    if "compute" in carried:
        args += ["--compute", json.dumps(list(asked["compute"].specs))]
    for member in ("collectives", "bandwidth"):
        if member in carried:
            args += [f"--{member}", json.dumps(list(asked[member].args))]
    if "bandwidth" in carried and asked["bandwidth"].counts != counts:
        args.append("--bandwidth-per-node")
    return torchjob.TorchJob(job="probes", args=tuple(args), counts=counts,
                             timeout=sum(asked[m].timeout for m in carried))


def fitting(asked: dict[str, Part]) -> list[str]:
    """The parts one job can carry: the same nodes; ranks per node that fit (bandwidth: one per
    node, or as many as the collectives); a compute spec for every node."""
    torch_parts: list[str] = [m for m in ("collectives", "bandwidth") if m in asked]
    if not torch_parts:
        return []
    first = asked[torch_parts[0]]
    carried: list[str] = [m for m in torch_parts if asked[m].indexes == first.indexes]
    if "collectives" in carried and "bandwidth" in carried and \
            asked["bandwidth"].counts not in (ones(asked["bandwidth"].counts), asked["collectives"].counts):
        carried.remove("bandwidth")
    compute = asked.get("compute")
    if compute is not None and compute.indexes == first.indexes and all(compute.specs):
        carried.insert(0, "compute")
    return carried


def ones(counts: tuple[int, ...]) -> tuple[int, ...]:
    """One rank on each of these nodes (bandwidth between nodes: each node's local rank 0)."""
    return (1,) * len(counts)


def printed(results: list[JobResult], member: str) -> bool:
    """Whether the shared job holds this part's answer: the collectives' always (a group that did
    not form is their finding); bandwidth's where a rank printed it; compute's on every node; a
    stranger's value in the store, for every part."""
    if any(r.json_lines(protocol.INTERFERED) for r in results) or member == "collectives":
        return True
    if member == "compute":
        return all(r.json_lines(MARKERS[member]) for r in results)
    return any(r.json_lines(MARKERS[member]) for r in results)


def serial(together: Together | None):
    """Around a probe's own job: one at a time when the probes run together."""
    return together.lock if together is not None else contextlib.nullcontext()
