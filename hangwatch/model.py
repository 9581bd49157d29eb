"""What hangwatch knows about a run at one moment: the objects `hangwatch attach --json` prints
and the dashboard renders. Plain data; `to_json()` gives the contract's JSON form.

A snapshot, as JSON:
{
  "time": 1763700000.0,                        # when it was taken (master's clock, epoch s)
  "threshold": 8.0,                            # stall threshold, seconds
  "run": {"backend": "gloo", "master": "10.213.5.200:29500", "nnodes": 2,
          "nproc_per_node": 2, "launched": true} | null,
  "nodes": [{"name": "master", "status": "watching|connecting|lost|error",
             "message": str|null, "interface": "eth0"|null, "ranks": 2,
             "net_bytes_per_s": float|null}],
  "ranks": [{"node": "master", "pid": 4242, "rank": 0, "local_rank": 0, "world_size": 4,
             "cpu": 97.0,                      # % of one core over the last sample
             "history": [97.0, 95.1, ...],     # last 60 samples, oldest first
             "state": "computing|collective|gpu-wait|rendezvous|loading-data|compiling|saving|idle|exited|unknown|running",
             "op": "all_reduce"|null,          # the collective, when state == collective
             "frame": "train.py:88"|null,      # the training code's innermost line
             "function": "train_step"|null,
             "wchan": "futex_do_wait"|null,    # kernel wait channel
             "idle_for": 0.0,                  # seconds at ~0% CPU
             "exit": "exit code 1"|"signal 9"|null,
             "last_line": str|null,            # last output line (launch mode)
             "step": int|null, "step_rate": float|null,   # from the output's "step N" lines
             "stack": [{"function": str, "file": str, "line": int}] | null,   # innermost first
             "flight": {"groups": [{"group": "default_pg", "seq": 1235, "op": "all_reduce"}]} | null,
                                               # Flight Recorder: launched ranks, or ranks that opted in
             "gpu": 0|null, "gpu_util": 100.0|null, "gpu_memory_util": 0.0|null}],
                                               # its GPU (NVML), on GPU nodes
  "diagnosis": {"kind": "deadlock|mismatch|network-stall|rendezvous-stall|exited|endless|gpu-hang|stall"
                        "|slow|straggler|unseen|alone",
                "summary": str, "guilty": [1], "causes": [str], "since": epoch s,
                "evidence": [str]} | null,
  "incidents": ["/var/tmp/hangwatch/incident-20261121-101500-deadlock"],
  "messages": [str],                           # one-line notices: a node lost, no ptrace, ...
  "preflight": {"ok": bool, "results": [...]} | null   # the preflight report (launch mode)
}
"state": "running" means sampled but not yet classified from a stack (stacks are taken when
progress stops, and otherwise rarely).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

HISTORY = 60


class Word(str, enum.Enum):
    """A closed set of words: compares equal to its word, and prints as it."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class NodeStatus(Word):
    CONNECTING = "connecting"     # its agent is starting
    WATCHING = "watching"
    LOST = "lost"                 # its agent stopped or went silent: its ranks are unknown
    ERROR = "error"               # its agent could not start


class RankStatus(Word):
    """What a rank is doing, in the user's words (classify.py decides it from the evidence)."""
    RUNNING = "running"           # sampled, using CPU, not yet looked at (or moved since its stack)
    COMPUTING = "computing"
    COLLECTIVE = "collective"     # waiting in one (its name is RankView.op)
    GPU_WAIT = "gpu-wait"         # its host thread waits for its GPU (cudaStreamSynchronize...)
    RENDEZVOUS = "rendezvous"     # creating the process group
    LOADING_DATA = "loading-data"
    COMPILING = "compiling"
    SAVING = "saving"
    IDLE = "idle"                 # no CPU, not in a collective: where it is, its line says
    EXITED = "exited"
    UNKNOWN = "unknown"           # not seen: no stack, or its node is lost


class Kind(Word):
    """What the ranks together say (diagnose.py). The hangs are the kinds that name a stop of
    progress with a culprit or a cause: they write a bundle and --stop-on-hang acts on them."""
    DEADLOCK = "deadlock"                   # a rank left the loop; the others wait for it
    MISMATCH = "mismatch"                   # ranks wait in different collectives
    NETWORK_STALL = "network-stall"         # every rank waits, none computes, no data flows
    RENDEZVOUS_STALL = "rendezvous-stall"   # every rank stuck creating the process group
    EXITED = "exited"                       # a rank failed, or left first: the first one to go
    ENDLESS = "endless"                     # a rank computes for far longer than its peers wait
    GPU_HANG = "gpu-hang"                   # ranks wait on a GPU that never finishes its work
    STALL = "stall"                         # no CPU anywhere, stacks unavailable: who cannot be told
    SLOW = "slow"                           # every rank waits, but data is still flowing
    STRAGGLER = "straggler"                 # a rank computes while the others wait: not a hang
    UNSEEN = "unseen"                       # only ranks nobody sees could be to blame: not a hang
    ALONE = "alone"                         # ranks of one world never connect: each trains alone (not a hang)
    NONE = "none"

    @property
    def is_hang(self) -> bool:
        return self in HANGS


HANGS = frozenset({Kind.DEADLOCK, Kind.MISMATCH, Kind.NETWORK_STALL, Kind.RENDEZVOUS_STALL, Kind.EXITED,
                   Kind.STALL, Kind.ENDLESS, Kind.GPU_HANG})


@dataclass
class NodeView:
    name: str
    status: NodeStatus = NodeStatus.CONNECTING
    message: str | None = None
    interface: str | None = None
    ranks: int = 0
    net_bytes_per_s: float | None = None


@dataclass
class RankView:
    node: str
    pid: int
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    cpu: float = 0.0
    history: list[float] = field(default_factory=list)
    state: RankStatus = RankStatus.RUNNING
    op: str | None = None
    frame: str | None = None
    function: str | None = None
    wchan: str | None = None
    idle_for: float = 0.0
    exit: str | None = None
    last_line: str | None = None
    step: int | None = None
    step_rate: float | None = None
    stack: list[dict] | None = None
    flight: dict | None = None
    gpu: int | None = None                # the GPU it computes on (NVML), and that GPU's
    gpu_util: float | None = None         # utilization and memory activity, % of the last sample
    gpu_memory_util: float | None = None

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"


@dataclass(frozen=True)
class Diagnosis:
    """What the ranks together say, with the ranks to look at and the likely causes; `since`
    (when progress stopped, epoch s) and `evidence` (each rank's state and why) once reported.
    diagnose.py makes them with tuples; a snapshot holds them with lists, as its JSON does."""
    kind: Kind
    summary: str
    guilty: Sequence[int] = ()
    causes: Sequence[str] = ()
    since: float | None = None
    evidence: Sequence[str] = ()

    def as_reported(self, since: float, evidence: list[str]) -> Diagnosis:
        return replace(self, guilty=list(self.guilty), causes=list(self.causes), since=since, evidence=list(evidence))


@dataclass
class Snapshot:
    time: float
    threshold: float
    run: dict | None = None
    nodes: list[NodeView] = field(default_factory=list)
    ranks: list[RankView] = field(default_factory=list)
    diagnosis: Diagnosis | None = None
    incidents: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    preflight: dict | None = None

    def to_json(self) -> dict:
        return _plain(asdict(self))

    @classmethod
    def from_json(cls, data: dict) -> Snapshot:
        diagnosis = data.get("diagnosis")
        return cls(time=data["time"], threshold=data["threshold"], run=data.get("run"),
                   nodes=[NodeView(**{**n, "status": NodeStatus(n.get("status", "connecting"))})
                          for n in data.get("nodes", [])],
                   ranks=[RankView(**{**r, "state": RankStatus(r.get("state", "running"))}) for r in data.get("ranks", [])],
                   diagnosis=Diagnosis(**{**diagnosis, "kind": Kind(diagnosis["kind"])}) if diagnosis else None,
                   incidents=list(data.get("incidents", [])), messages=list(data.get("messages", [])),
                   preflight=data.get("preflight"))


def _plain(value):
    """Enums as their values: the JSON contract holds plain strings."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


@dataclass
class Event:
    """One line of the watch's stream (`hangwatch attach` prints them; --json as objects)."""
    kind: str            # rank-found | rank-gone | node | diagnosis | straggler | resumed | incident | notice
    text: str
    snapshot: Snapshot | None = None
    data: dict = field(default_factory=dict)


class Source:
    """What the dashboard reads and asks: implemented by the live watcher (hangwatch/watch.py)
    and, in tests and benches, by recorded snapshots. Every method returns at once; work
    happens in the source's own threads."""

    launched: bool = False            # True: quitting may stop the training it started

    def snapshot(self) -> Snapshot:
        raise NotImplementedError

    def dump_stacks(self) -> None:
        """Take every rank's stack now (the next snapshot has them)."""

    def write_bundle(self) -> str | None:
        """Write an incident bundle now; its path."""
        return None

    def log(self, node: str, rank: int | None = None, lines: int = 200) -> list[str]:
        """The last output lines of a rank (or a node's whole log)."""
        return []

    def stop(self) -> None:
        """Stop the training this source launched (no-op when attached)."""
