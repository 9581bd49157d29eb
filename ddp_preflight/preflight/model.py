"""The one model every output renders: results of checks about nodes.

The JSON report, the text table, the JUnit file and the dashboard are views of these objects."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ddp_preflight.rules.facts import NodeFacts
from ddp_preflight.rules.fix import Fix
from ddp_preflight.rules.training_env import TrainingEnv

if TYPE_CHECKING:
    from ddp_preflight.transport.slurm import SlurmJob


class Status(str, enum.Enum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"       # could not or need not check (e.g. no --data-dir given)
    ERROR = "error"     # the check itself could not run on this node: the reason is the summary

    @property
    def severity(self) -> int:
        """0: fine (pass, skip); 1: a warning; 2: a failure (fail, error). For the worst of
        several, and the overall outcome."""
        return {"pass": 0, "skip": 0, "warn": 1, "fail": 2, "error": 2}[self.value]


@dataclass(frozen=True)
class Verdict:
    """What a check says about one node (or the cluster): a Result without the check's id,
    which the runner adds (checks/__init__.py), so a check never writes its own id."""
    status: Status
    node: str | None            # the node it is about; None for the cluster as a whole
    summary: str                # one line: what is wrong (or right)
    fix: Fix | None = None      # what to run, set or change, on which node
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Result:
    check: str                  # a stable id from the registry, e.g. "address-family"
    status: Status
    node: str | None            # the node it is about; None for the cluster as a whole
    summary: str                # one line: what is wrong (or right)
    fix: str | None = None      # what to paste to fix it: the verdict's Fix as text (the JSON contract)
    details: Mapping[str, Any] = field(default_factory=dict)
    remedy: Fix | None = field(default=None, compare=False, repr=False)   # that fix as data: the
    #                             report says one cause's fix once, however many checks see it

    def __post_init__(self):
        object.__setattr__(self, "details", MappingProxyType(dict(self.details)))

    def to_json(self) -> dict:
        return {"check": self.check, "status": self.status.value, "node": self.node,
                "summary": self.summary, "fix": self.fix, "details": _plain(self.details)}


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True)
class Options:
    """What the user asked for: the run preflight checks against."""
    backend: str = "gloo"
    device: str = "cpu"
    master_port: int = 29500
    master_addr: str | None = None       # as the workers will dial it
    nproc_per_node: int = 1
    nproc_auto: bool = False        # --nproc-per-node auto: settled from the facts (nproc_auto.py)
    data_dir: str | None = None
    launch_args: tuple[str, ...] = ()    # the training command after `--`, if given
    clock_tolerance: float = 2.0         # seconds
    min_time_left: float = 600.0         # seconds a Slurm job should have left (--min-time-left)
    params: int | None = None            # model parameters, to predict communication per step
    scan: str | None = None              # training code to scan for collectives that fail
    env: TrainingEnv = TrainingEnv()     # the training's variables on top of each node's own (--env, config)
    launch: bool = False                 # --launch: the training starts right after, as launch/plan.py builds it
    data_dirs: Mapping[str, str] = field(default_factory=dict)   # node -> its own data folder, where set
    pythons: Mapping[str, str] = field(default_factory=dict)     # node -> the training Python --python or
    #                                                              the config named (absent: this interpreter's)
    nprocs: Mapping[str, int] = field(default_factory=dict)      # node -> its own ranks (a hostfile's slots
    #                                                              where hosts differ); absent: nproc_per_node

    def nproc_on(self, node: str) -> int:
        """The ranks torchrun starts on `node`: its own count, else nproc_per_node."""
        return self.nprocs.get(node, self.nproc_per_node)

    def data_dir_of(self, node: str) -> str | None:
        """The data folder on `node`: its own ([nodes.NAME] data_dir), else the one for every node."""
        return self.data_dirs.get(node) or self.data_dir


@dataclass(frozen=True)
class Context:
    """Everything a check may read. nodes[0] is the master."""
    nodes: tuple[NodeFacts, ...]
    options: Options = Options()
    probes: Mapping[str, Any] = field(default_factory=dict)   # probe name -> what it measured
    slurm: SlurmJob | None = None        # the Slurm job preflight reaches the nodes through, as Slurm shows it

    @property
    def master(self) -> NodeFacts:
        return self.nodes[0]

    @property
    def reachable(self) -> tuple[NodeFacts, ...]:
        return tuple(n for n in self.nodes if n.error is None)


@dataclass(frozen=True)
class Check:
    id: str                     # stable: --only, the JSON report and docs/checks/ID.md use it
    title: str                  # one line for --list
    run: Callable[[Context], Iterable[Verdict]]
    needs: tuple[str, ...] = ()   # probes whose data it judges (they run across the nodes first)


@dataclass(frozen=True)
class Report:
    results: tuple[Result, ...]
    nodes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not any(r.status.severity >= 2 for r in self.results)

    def ok_strict(self) -> bool:
        return not any(r.status.severity >= 1 for r in self.results)

    @property
    def fixes(self) -> tuple[FixSaid, ...]:
        """Each fix of a warning, failure or error once, in the order first seen, with every
        result that offers it: one Fix value (its steps and its node) is one fix, whichever
        checks found its cause. A fix that came as words only (no Fix) is its result's own."""
        groups: dict[object, list[Result]] = {}
        for r in self.results:
            if r.fix and r.status.severity >= 1:
                groups.setdefault(r.remedy if r.remedy is not None else id(r), []).append(r)
        return tuple(FixSaid(found[0].fix or "", found[0].remedy, tuple(found)) for found in groups.values())

    def to_json(self, strict: bool = False) -> dict:
        return {"ok": self.ok_strict() if strict else self.ok, "nodes": list(self.nodes),
                "results": [r.to_json() for r in self.results]}


@dataclass(frozen=True)
class FixSaid:
    """One fix as the text report says it: its text, and the results (checks, nodes) that offer
    it. The JSON report keeps each result's own `fix` (the contract); this is the table's list."""
    text: str
    remedy: Fix | None
    results: tuple[Result, ...]

    @property
    def checks(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.check for r in self.results))

