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
             "state": "computing|collective|rendezvous|loading-data|compiling|saving|idle|exited|unknown|running",
             "op": "all_reduce"|null,          # the collective, when state == collective
             "frame": "train.py:88"|null,      # the training code's innermost line
             "function": "train_step"|null,
             "wchan": "futex_do_wait"|null,    # kernel wait channel
             "idle_for": 0.0,                  # seconds at ~0% CPU
             "exit": "exit code 1"|"signal 9"|null,
             "last_line": str|null,            # last output line (launch mode)
             "step": int|null, "step_rate": float|null,   # from the output's "step N" lines
             "stack": [{"function": str, "file": str, "line": int}] | null,   # innermost first
             "flight": {"groups": [{"group": "default_pg", "seq": 1235, "op": "all_reduce"}]} | null}],
                                               # Flight Recorder, for ranks that opted in
  "diagnosis": {"kind": "deadlock|mismatch|network-stall|rendezvous-stall|straggler|exited|stall|slow|unseen",
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

from dataclasses import asdict, dataclass, field

HISTORY = 60


@dataclass
class NodeView:
    name: str
    status: str = "connecting"
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
    state: str = "running"
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

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"


@dataclass
class DiagnosisView:
    kind: str
    summary: str
    guilty: list[int] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)
    since: float | None = None
    evidence: list[str] = field(default_factory=list)


@dataclass
class Snapshot:
    time: float
    threshold: float
    run: dict | None = None
    nodes: list[NodeView] = field(default_factory=list)
    ranks: list[RankView] = field(default_factory=list)
    diagnosis: DiagnosisView | None = None
    incidents: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    preflight: dict | None = None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Snapshot:
        return cls(time=data["time"], threshold=data["threshold"], run=data.get("run"),
                   nodes=[NodeView(**n) for n in data.get("nodes", [])],
                   ranks=[RankView(**r) for r in data.get("ranks", [])],
                   diagnosis=DiagnosisView(**data["diagnosis"]) if data.get("diagnosis") else None,
                   incidents=list(data.get("incidents", [])), messages=list(data.get("messages", [])),
                   preflight=data.get("preflight"))


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
