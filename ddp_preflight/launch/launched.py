"""What a launch knows of each rank and node as it runs and once it ended (plain data): the
launcher fills it (run.py), the one judge reads its ends (ends.py), the summary renders it
(outcome.py)."""

from __future__ import annotations

import signal as signals
from dataclasses import asdict, dataclass, field

from ddp_preflight.hangwatch.exits import StoppedBy
from ddp_preflight.hangwatch.failures import Said
from ddp_preflight.hangwatch.model import Diagnosis, Word
from ddp_preflight.hangwatch.tracebacks import ExceptionInfo
from ddp_preflight.hangwatch.who import Who, who
from ddp_preflight.node.protocol import ExitStatus


class Why(Word):
    """Why a rank did not end by itself, or has no exit status (a closed set; the words are
    rendered from it and its rank's fields by LaunchedRank.why_text)."""
    STOPPED_BY_US = "stopped by ddp-preflight"             # ddp-preflight's stop ended it (exits.stop_of)
    STOPPED_BY_TORCHRUN = "stopped by torchrun"           # torchrun stopped it (LaunchedRank.stopped_for: whose failure)
    LOST_TO_OUR_STOP = "lost its peer when ddp-preflight stopped the run"
    NOT_STARTED = "not started"
    NODE_FAILED = "not started: the node failed (above)"
    STOPPED_BEFORE_START = "not started: stopped by ddp-preflight before it started"
    TORCHRUN_KILLED = "no exit status: its torchrun was killed, stopped by ddp-preflight"
    TORCHRUN_ENDED = "no exit status: its torchrun ended"   # LaunchedRank.torchrun: how


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
    why: Why | None = None             # who stopped it, when it did not end by itself
    stopped_for: tuple[Who, ...] = ()  # Why.STOPPED_BY_TORCHRUN: the rank of its node whose failure it was stopped
                                       # for (several: one of them, the rule cannot tell which)
    torchrun: ExitStatus | None = None  # Why.TORCHRUN_ENDED: how its node's torchrun ended
    node_error: str | None = None      # ... and the node's error then
    error: ExceptionInfo | None = None  # the exception its output shows, if any
    stopped_by: StoppedBy | None = None   # torchrun: its launcher began stopping it (the launch program said so)
    error_after_stop: bool = False     # its error's lines came after ddp-preflight began stopping the run
    failed_first: bool = False         # it had already ended, not cleanly, when torchrun began stopping its node's
                                       # ranks (the launch program's "stopping" marker lists it as failed)

    @property
    def status(self) -> ExitStatus | None:
        """How its process ended (ddp_preflight.node.protocol's one type): its code, or the signal; None: not known."""
        return ExitStatus(signal=self.signal) if self.signal is not None else \
            ExitStatus(code=self.exit) if self.exit is not None else None

    @property
    def ok(self) -> bool:
        return self.exit == 0

    @property
    def ended(self) -> bool:
        return self.status is not None

    def why_text(self) -> str | None:
        """Its why in words, from its fields (a copy written out for the terminal holds its word as a str)."""
        why = Why(self.why) if self.why is not None else None
        if why is Why.STOPPED_BY_TORCHRUN:
            first = self.stopped_for
            return why.value + (f" when {who(first)} failed" if len(first) == 1 else
                                     f" when one of {who(first)} failed" if first else "")
        if why is Why.TORCHRUN_KILLED:
            return f"no exit status: torchrun on {self.node} was killed, {Why.STOPPED_BY_US.value}"
        if why is Why.TORCHRUN_ENDED:
            t = self.torchrun
            how = f"exit code {t.code}" if t is not None and t.code is not None else \
                f"signal {t.signal}" if t is not None else "no exit status"
            return f"no exit status (torchrun on {self.node} ended with {how}" + \
                (f"; {self.node_error})" if self.node_error else ")")
        return why.value if why is not None else None

    def outcome(self) -> str:
        """'exit code 1', 'signal 15 (SIGTERM), stopped by ddp-preflight', or why it is not known."""
        why = self.why_text()
        if self.exit is not None:
            return f"exit code {self.exit}" + (f", {why}" if why else "")
        if self.signal is not None:
            text = f"signal {self.signal} ({_signal_name(self.signal)})"
            return f"{text}, {why}" if why else text
        return why or "no exit status"


class NodeRun(Word):
    """Where a node's training is (a closed set)."""
    STARTING = "starting"
    RUNNING = "running"
    EXITED = "exited"              # torchrun ended with code 0
    FAILED = "failed"              # torchrun ended with another code or a signal
    STOPPED = "stopped"            # ddp-preflight stopped it while it ran
    ERROR = "error"                # the node could not start, or its connection dropped
    NOT_STARTED = "not started"    # the run was stopped before it started here


@dataclass
class NodeState:
    node: str
    status: NodeRun = NodeRun.STARTING
    exit: int | None = None            # torchrun's exit code on the node
    signal: int | None = None
    error: str | None = None           # the node could not start, or its connection dropped
    fix: str | None = None
    stopped: bool = False              # ddp-preflight stopped it while it ran
    launched: bool = False             # torchrun was started (the node's checks before it passed)
    watched: bool = False              # the node reports each rank's start and exit
    ended_at: float | None = None      # epoch seconds
    said: list[Said] = field(default_factory=list)   # what its torchrun's own lines named (its parser, its store)


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
