"""Who holds the master port, training processes already there, whether stacks can be read
(node/facts/processes.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .read import Sent, flag, number, objects, present, required, sent_of, text, texts, whole


@dataclass(frozen=True)
class Process(Sent):
    """A process on the node, as stale-processes and master-port describe one."""
    pid: int
    cmdline: tuple[str, ...] = ()
    age_seconds: float | None = None   # None: its start time was not readable
    orphan: bool = False               # its parent is PID 1: what started it is gone
    why: tuple[str, ...] = ()          # why it looks like training; empty: it does not
    # Its owner (None: not said, a recording from before) and that owner's name on the node.
    uid: int | None = field(default=None, kw_only=True)
    user_name: str | None = field(default=None, kw_only=True)
    # A rank of another ddp-preflight's probe job running now: the job ("probes") and the pid of
    # the node program it runs under (None: not one).
    job: str | None = field(default=None, kw_only=True)
    node_program: int | None = field(default=None, kw_only=True)

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> Process:
        return cls(required(whole(wire, "pid"), "pid"), texts(wire, "cmdline"), number(wire, "age_seconds"),
                   flag(wire, "orphan"), texts(wire, "why"), uid=whole(wire, "uid"), user_name=text(wire, "user"),
                   job=text(wire, "job"), node_program=whole(wire, "node_program"), sent=sent_of(wire))

    def owner(self) -> str:
        """Its owner as a person reads it: the name, else the uid."""
        return self.user_name or (f"uid {self.uid}" if self.uid is not None else "an unknown user")


@dataclass(frozen=True)
class PortHolders:
    """Who listens on the master port."""
    listening: bool
    holders: tuple[Process, ...]       # the processes whose sockets could be attributed
    port: int | None = None

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> PortHolders:
        present(wire, "listening")
        present(wire, "holders")
        return cls(flag(wire, "listening"), objects(wire, "holders", Process.from_json), whole(wire, "port"))


def training_processes(wire: Mapping[str, Any]) -> tuple[Process, ...]:
    """The processes section: those that look like a training run (torchrun, a rank, a train*.py)."""
    present(wire, "processes")
    return objects(wire, "processes", Process.from_json)


@dataclass(frozen=True)
class PtraceFacts(Sent):
    ptrace_scope: int | None     # Yama's kernel.yama.ptrace_scope; None: no Yama, no restriction
    euid: int | None = None
    cap_sys_ptrace: bool = False

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> PtraceFacts:
        present(wire, "ptrace_scope")      # its null means something: it must be said
        return cls(whole(wire, "ptrace_scope"), whole(wire, "euid"), flag(wire, "cap_sys_ptrace"),
                   sent=sent_of(wire))
