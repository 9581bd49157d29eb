"""What the watcher's reducer takes (inputs: what happened) and gives back (effects: what the shell,
watch.py, must do). Plain data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ddp_preflight.node import protocol
from ddp_preflight.node.protocol import ExitStatus

from .events import Event
from .model import Snapshot
from .tracebacks import ExceptionInfo

# -- inputs ----------------------------------------------------------------------------------

# What an agent says (node/protocol.py's AGENT_MESSAGES, parsed by protocol.agent_message).
AgentMessage = Union[protocol.Hello, protocol.RankFound, protocol.Sample, protocol.Stacks, protocol.Stores,
                     protocol.RankExit, protocol.PySpyAnswer, protocol.ClockAnswer, protocol.LauncherFound]


@dataclass(frozen=True)
class FromAgent:
    node: str
    message: AgentMessage


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
class BundleAsked:
    """A bundle the user asked for (the dashboard's b) was written: kept, no hang named."""
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


# -- what a launcher knows (ddp-preflight --launch) --------------------------------------------

@dataclass(frozen=True)
class LauncherStopping:
    """A launcher began stopping ranks: torchrun on `node` (its clock, `t`: the launch program's
    marker), or ddp-preflight on every node (`node` None; `t` on the master's clock)."""
    node: str | None
    t: float
    by: str                    # "torchrun" | "ddp-preflight"


@dataclass(frozen=True)
class RankError:
    """A launched rank printed an exception (ddp_preflight/hangwatch/tracebacks.py read it in its output)."""
    node: str
    rank: int
    exception: ExceptionInfo


@dataclass(frozen=True)
class RankEnded:
    """The launcher saw a rank end: its exit code or signal, as torchrun collected it."""
    node: str
    rank: int
    pid: int | None
    status: ExitStatus


@dataclass(frozen=True)
class RankStepped:
    """The launcher read a step line of a rank with a step number it had not printed before:
    progress, whatever its CPU (its step may be mostly waiting)."""
    node: str
    rank: int
    step: int


# -- effects ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Say:
    event: Event


@dataclass(frozen=True)
class AskStacks:
    nodes: tuple[str, ...]
    command: dict


@dataclass(frozen=True)
class Send:
    """A command to one node's agent."""
    node: str
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
    certain: bool = False      # the hang was said as certain: only then does --stop-on-hang act (model.stops)


# The closed sets the reducer takes and gives back (reducer.step).
Input = Union[FromAgent, AgentClosed, AgentFailed, Tick, Notice, BundleWritten, BundleAsked, BundleFailed,
              TakeStacks, Stopping, LauncherStopping, RankError, RankEnded, RankStepped]
Effect = Union[Say, AskStacks, Send, WriteBundle, BringPySpy, HangNamed]
