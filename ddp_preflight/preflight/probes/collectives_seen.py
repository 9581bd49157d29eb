"""What the collectives probe measured, as typed data: every rank's process-group creation, each
case of the matrix (an operation, a mode, a dtype) and how it went, each node's job, the retry
with preflight's interface pin, and what --scan found in the training code. The probe's JSON
(preflight/probes/collectives.py) stays the wire and the recording; the collectives check reads
these fields, and a record it puts in its details keeps the JSON as it came (`sent`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .network_seen import Dial

Sent = Mapping[str, Any]


def _sent(wire: Mapping[str, Any]) -> Sent:
    return MappingProxyType(dict(wire))


def _message(wire: Sent) -> str:
    """'Type: message' as the probe reported them (either may be absent)."""
    return f"{wire.get('error_type', '')}: {wire.get('error', '')}".lstrip(": ")


@dataclass(frozen=True)
class Case:
    """One case of the matrix; `status`: ok, error (it raised), wrong (numbers off by more than
    rounding), not run."""
    op: str
    mode: str                        # sync, async_wait, async_future
    dtype: str | None
    status: str
    error_type: str | None = None
    error: str | None = None
    ranks_failing: tuple[int, ...] = ()
    deprecated: str | None = None
    sent: Sent = field(default_factory=dict, compare=False)

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> Case:
        return cls(wire["op"], wire["mode"], wire.get("dtype"), wire["status"], wire.get("error_type"),
                   wire.get("error"), tuple(wire.get("ranks_failing") or ()), wire.get("deprecated"), _sent(wire))

    @property
    def failed(self) -> bool:
        return self.status not in ("ok", "not run")

    @property
    def message(self) -> str:
        return _message(self.sent)

    @property
    def what_failed(self) -> str:
        return "wrong results" if self.status == "wrong" else self.message


@dataclass(frozen=True)
class RankStart:
    """One rank's init_process_group: it formed the group (`ok`), raised, or hit the job's bound."""
    node: str
    ok: bool
    seconds: float
    timed_out: bool = False
    error_type: str | None = None
    error: str | None = None
    sent: Sent = field(default_factory=dict, compare=False)

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> RankStart:
        return cls(wire["node"], bool(wire.get("ok")), wire.get("seconds", 0.0), bool(wire.get("timed_out")),
                   wire.get("error_type"), wire.get("error"), _sent(wire))

    @property
    def message(self) -> str:
        return _message(self.sent)


@dataclass(frozen=True)
class JobEnd:
    """How one node's torchrun job ended, when it said why."""
    error: str | None = None
    timed_out: bool = False
    seconds: float = 0.0
    reason: str | None = None
    tail: str | None = None          # its last output, when nothing else says why

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> JobEnd:
        return cls(wire.get("error"), bool(wire.get("timed_out")), wire.get("seconds", 0.0), wire.get("reason"),
                   wire.get("tail"))


@dataclass(frozen=True)
class Attempt:
    """Process-group creation once: its ranks, its jobs, the interface variable each node had."""
    init: tuple[RankStart, ...]
    jobs: Mapping[str, JobEnd]
    env: Mapping[str, Mapping[str, str | None]]
    sent: Sent = field(default_factory=dict, compare=False)

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> Attempt:
        return cls(tuple(RankStart.from_json(r) for r in wire.get("init", ())),
                   {n: JobEnd.from_json(j) for n, j in (wire.get("jobs") or {}).items()},
                   dict(wire.get("env") or {}), _sent(wire))

    def formed(self, world: int) -> bool:
        """Every rank reported and formed the group."""
        return len(self.init) >= world and all(r.ok for r in self.init)


@dataclass(frozen=True)
class CaseEnd:
    """The case the process group broke after (`reason`), or the job was stopped in."""
    op: str
    mode: str
    dtype: str | None
    reason: str | None = None
    sent: Sent = field(default_factory=dict, compare=False)

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> CaseEnd:
        case = wire["case"]
        return cls(case["op"], case["mode"], case.get("dtype"), wire.get("reason"), _sent(wire))


@dataclass(frozen=True)
class CallSite:
    file: str
    line: int
    op: str
    mode: str
    wrapped: str | None = None       # the shim or try/except that makes it safe, when there is one
    sent: Sent = field(default_factory=dict, compare=False)

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> CallSite:
        return cls(wire["file"], wire["line"], wire["op"], wire["mode"], wire.get("wrapped"), _sent(wire))


@dataclass(frozen=True)
class InitSite:
    """An init_process_group call, and the condition it sits under."""
    file: str
    line: int
    cuda_only: bool
    guard: str | None = None
    guard_line: int | None = None
    otherwise: tuple[str, ...] = ()
    call: str = "dist.init_process_group"    # as the code writes it
    statement_end: int | None = None   # the last line of that `if` (its else too): the CPU fix goes after it
    column: int | None = None          # the `if`'s indentation
    sent: Sent = field(default_factory=dict, compare=False)

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> InitSite:
        return cls(wire["file"], wire["line"], bool(wire.get("cuda_only")), wire.get("guard"), wire.get("guard_line"),
                   tuple(wire.get("otherwise") or ()), wire.get("call") or "dist.init_process_group",
                   wire.get("statement_end"), wire.get("column"), _sent(wire))


@dataclass(frozen=True)
class PinSite:
    """A torch.cuda.set_device call: lines `first_line` to `line` (with the assignment that makes
    its argument a CUDA device), whether a CUDA condition guards it."""
    file: str
    line: int
    first_line: int
    guarded: bool
    text: str
    column: int = 0
    sent: Sent = field(default_factory=dict, compare=False)

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> PinSite:
        return cls(wire["file"], wire["line"], wire.get("first_line") or wire["line"], bool(wire.get("guarded")),
                   wire.get("text") or "", wire.get("column") or 0, _sent(wire))


@dataclass(frozen=True)
class Scan:
    """What --scan found: None for `sites` when nothing was scanned."""
    path: str | None = None
    error: str | None = None
    sites: tuple[CallSite, ...] | None = None
    inits: tuple[InitSite, ...] = ()
    pins: tuple[PinSite, ...] = ()

    @classmethod
    def from_json(cls, wire: Mapping[str, Any] | None) -> Scan:
        wire = wire or {}
        sites = wire.get("sites")
        return cls(wire.get("path"), wire.get("error"),
                   None if sites is None else tuple(CallSite.from_json(s) for s in sites),
                   tuple(InitSite.from_json(i) for i in wire.get("inits") or ()),
                   tuple(PinSite.from_json(p) for p in wire.get("pins") or ()))


@dataclass(frozen=True)
class CollectivesSeen:
    backend: str
    device: str
    world: int
    nodes: tuple[str, ...]
    seconds: float
    bound: float                     # seconds: the job's limit for process-group creation
    port: int
    first: Attempt                   # as configured
    pinned: Attempt | None           # again with preflight's interface pin, when the first did not form
    matrix: tuple[Case, ...]
    broken: CaseEnd | None
    stopped: CaseEnd | None
    scan: Scan
    sent: Sent = field(default_factory=dict, compare=False)
    # The paths the ranks would use as the nodes are set up that the network probe found blocked:
    # that attempt was not started, the one with preflight's pin ran alone (it is `first`).
    unpinned_blocked: tuple[Dial, ...] = ()

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> CollectivesSeen:
        pinned = wire.get("pinned")
        return cls(wire["backend"], wire["device"], wire["world"], tuple(wire["nodes"]), wire["seconds"],
                   wire.get("bound", 0.0), wire.get("port", 0), Attempt.from_json(wire),
                   None if not pinned else Attempt.from_json(pinned),
                   tuple(Case.from_json(r) for r in wire.get("matrix") or ()),
                   None if not wire.get("broken") else CaseEnd.from_json(wire["broken"]),
                   None if not wire.get("stopped") else CaseEnd.from_json(wire["stopped"]),
                   Scan.from_json(wire.get("scan")), _sent(wire),
                   tuple(Dial.from_json(d) for d in wire.get("unpinned_blocked") or ()))
