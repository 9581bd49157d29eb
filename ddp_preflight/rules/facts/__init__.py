"""A node's facts as typed data: the collectors' JSON (node/facts), parsed once on the master.

The wire stays JSON: one object, one section per collector, a failed section {"error": ...}.
Here every section is a frozen dataclass, or a `Missing` that says why it is not there: the
collector failed (its error), or it did not send one (an older collector, a node not reached).
Parsing is tolerant of other collector versions: keys this version does not know are ignored; a
key a section cannot do without, or a value of the wrong kind, makes that section a `Missing`
with the reason, never a KeyError in a check. Optional keys have a documented default.

Values a check puts in its result's details as a whole (a bind, a route, a process, a GPU) keep
the JSON the node sent (`sent`, read by `to_json()` only), so the JSON report shows the node's
own words, keys this version does not know included. Checks read the typed fields."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .code import CodeFacts
from .gpu import OLDER_COLLECTOR, DriverView, GpuDevice, GpuFacts, GpuLink, GpuProcess, Hca, HcaPort, NcclConf
from .imports import MissingImport, TrainingImports
from .launch import LaunchParse
from .network import Address, Firewall, GlooBind, Interface, NetworkFacts, Route
from .processes import PortHolders, Process, PtraceFacts, training_processes
from .read import Missing, Sent, Unreadable, section, texts
from .shards import ShardFile, ShardManifest
from .system import Clock, CpuFacts, MemoryFacts, OsFacts, PythonFacts, env_vars
from .torchinfo import CudaDevice, TorchFacts, Wheel

__all__ = ["OLDER_COLLECTOR", "Address", "Clock", "CodeFacts", "CpuFacts", "CudaDevice", "DriverView", "Facts",
           "Firewall", "GlooBind", "GpuDevice", "GpuFacts", "GpuLink", "GpuProcess", "Hca", "HcaPort", "Interface",
           "LaunchParse", "MemoryFacts", "Missing", "MissingImport", "NcclConf", "NetworkFacts", "OsFacts",
           "PortHolders", "Process", "PtraceFacts", "PythonFacts", "Route", "Sent", "ShardFile", "ShardManifest",
           "TorchFacts", "TrainingImports", "Unreadable", "Wheel", "NodeFacts"]


def _hash_algorithms(wire: Mapping[str, Any]) -> tuple[str, ...]:
    return texts(wire, "available")


@dataclass(frozen=True)
class Facts:
    """Everything one node reported, each section parsed or Missing with the reason."""
    os: OsFacts | Missing
    python: PythonFacts | Missing
    cpu: CpuFacts | Missing
    memory: MemoryFacts | Missing
    gpu: GpuFacts | Missing
    env: Mapping[str, str] | Missing           # the variables training reads (secrets redacted)
    torch: TorchFacts | Missing
    network: NetworkFacts | Missing
    master_port: PortHolders | Missing
    processes: tuple[Process, ...] | Missing   # those that look like a training run
    ptrace: PtraceFacts | Missing
    code: CodeFacts | Missing                  # Missing, not failed: no code folder was given
    shards: ShardManifest | Missing            # Missing, not failed: no data folder was given
    launch: LaunchParse | Missing              # the master's only, with a training command
    imports: TrainingImports | Missing         # every node's, with a training command
    hash_algorithms: tuple[str, ...] | Missing  # the digests the node can compute, best first
    clock: Clock | Missing                     # measured by the master, not the node
    reached_at: str | Missing                  # the address the master reached it at
    # Where nothing answered the master's ssh dial: the master's own interfaces and its route to
    # the node's address (route_to_master: the route toward the node here), read by the master.
    dialled_from_here: NetworkFacts | Missing = Missing("the node was reached")

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> Facts:
        """The facts program's JSON, with what the master added (clock, reached_at)."""
        reached = wire.get("reached_at")
        return cls(
            os=section(wire, "os", OsFacts.from_json), python=section(wire, "python", PythonFacts.from_json),
            cpu=section(wire, "cpu", CpuFacts.from_json), memory=section(wire, "memory", MemoryFacts.from_json),
            gpu=section(wire, "gpu", GpuFacts.from_json), env=section(wire, "env", env_vars),
            torch=section(wire, "torch", TorchFacts.from_json),
            network=section(wire, "network", NetworkFacts.from_json),
            master_port=section(wire, "master_port", PortHolders.from_json),
            processes=section(wire, "processes", training_processes),
            ptrace=section(wire, "ptrace", PtraceFacts.from_json),
            code=section(wire, "code", CodeFacts.from_json), shards=section(wire, "shards", ShardManifest.from_json),
            launch=section(wire, "launch", LaunchParse.from_json),
            imports=section(wire, "imports", TrainingImports.from_json),
            hash_algorithms=section(wire, "hash_algorithms", _hash_algorithms),
            clock=section(wire, "clock", Clock.from_json),
            reached_at=reached if isinstance(reached, str) else Missing("the address it was reached at is not known"),
            dialled_from_here=section(wire, "dialled_from_here", NetworkFacts.from_json))


@dataclass(frozen=True)
class NodeFacts:
    """What was collected on one node. `facts` is the JSON the node sent (one section per
    collector; a section that failed is {"error": "..."}), kept as sent for recordings;
    `parsed` is the same, typed, and what checks read. `error` means no facts at all."""
    node: str                   # the name the user gave (host alias)
    facts: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None    # why the node could not be reached or run the collector
    fix: str | None = None

    @cached_property
    def parsed(self) -> Facts:
        """The facts as typed data, parsed on first use, once per node."""
        return Facts.from_json(self.facts)
