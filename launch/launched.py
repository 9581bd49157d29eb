"""What a launch knows of each rank and node as it runs and once it ended (plain data): the
launcher fills it (run.py), the one judge reads its ends (ends.py), the summary renders it
(outcome.py)."""

from __future__ import annotations

import signal as signals
from dataclasses import asdict, dataclass, field

from hangwatch.exits import StoppedBy
from hangwatch.model import Diagnosis
from hangwatch.tracebacks import ExceptionInfo


@dataclass
class LaunchedRank:
    rank: int
    node: str
    local_rank: int
    pid: int | None = None             # on its node
    last_line: str | None = None
    step: int | None = None            # from its last "step N" line
    exit: int | None = None            # exit code, when it exited
    signal: int | None = None          # signal number, when a signal ended it
    why: str | None = None             # who stopped it, when it did not end by itself
    error: ExceptionInfo | None = None  # the exception its output shows, if any
    stopped_by: StoppedBy | None = None   # torchrun: its launcher began stopping it (the launch program said so)
    error_after_stop: bool = False     # its error's lines came after ddp-preflight began stopping the run
    failed_first: bool = False         # it had already ended, not cleanly, when torchrun began stopping its node's
                                       # ranks (the launch program's "stopping" marker lists it as failed)

    @property
    def ok(self) -> bool:
        return self.exit == 0

    @property
    def ended(self) -> bool:
        return self.exit is not None or self.signal is not None

    def outcome(self) -> str:
        """'exit code 1', 'signal 15 (stopped by ddp-preflight)', or why it is not known."""
        if self.exit is not None:
            return f"exit code {self.exit}" + (f", {self.why}" if self.why else "")
        if self.signal is not None:
            text = f"signal {self.signal} ({_signal_name(self.signal)})"
            return f"{text}, {self.why}" if self.why else text
        return self.why or "no exit status"


@dataclass
class NodeState:
    node: str
    status: str = "starting"           # starting | running | exited | failed | stopped | error | not started
    exit: int | None = None            # torchrun's exit code on the node
    signal: int | None = None
    error: str | None = None           # the node could not start, or its connection dropped
    fix: str | None = None
    stopped: bool = False              # ddp-preflight stopped it while it ran
    launched: bool = False             # torchrun was started (the node's checks before it passed)
    watched: bool = False              # the node reports each rank's start and exit
    ended_at: float | None = None      # epoch seconds


@dataclass
class LaunchResult:
    ranks: list[LaunchedRank]
    nodes: list[NodeState]
    stop_reason: str | None            # why ddp-preflight stopped the run (None: it ended by itself)
    first_failure: str | None          # the node that failed first
    seconds: float
    log_dir: str | None = None
    port_free: bool | None = None      # the master port could be bound afterwards (None: not tested)
    verdict: Diagnosis | None = None   # the verdict on the run: who failed first and why (or the hang named)
    judged: bool = False               # the verdict was decided (None then means: nothing failed); a result
                                       # with none that was never judged is judged by the summary, by the same rule
    notes: list[str] = field(default_factory=list)
    logs_error: str | None = None      # why the logs stopped before the end ("No space left on device")
    alone: tuple[int, ...] = ()        # every rank exited 0 but none ever joined a process group (hangwatch's
                                       # runs.ran_no_collective: no connection, no collective): each trained alone

    @property
    def ok(self) -> bool:
        return bool(self.ranks) and all(r.ok for r in self.ranks) and not any(n.error for n in self.nodes) \
            and not self.alone

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def failed_ranks(self) -> list[LaunchedRank]:
        """The ranks that failed by themselves (not stopped by anyone)."""
        return [r for r in self.ranks if r.ended and not r.ok and r.why is None]

    def to_json(self) -> dict:
        return {"ok": self.ok, "exit_code": self.exit_code, "stop_reason": self.stop_reason,
                "first_failure": self.first_failure, "seconds": round(self.seconds, 3),
                "log_dir": self.log_dir, "logs_complete": self.logs_error is None, "logs_error": self.logs_error,
                "port_free": self.port_free, "notes": list(self.notes), "alone": list(self.alone),
                "verdict": self.verdict.to_json() if self.verdict is not None else None,
                "nodes": [asdict(n) for n in self.nodes],
                "ranks": [{**asdict(r), "outcome": r.outcome()} for r in self.ranks]}


def _signal_name(number: int) -> str:
    try:
        return signals.Signals(number).name
    except ValueError:
        return "unknown signal"
