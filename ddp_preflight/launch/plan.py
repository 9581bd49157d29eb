"""What to start on each node: torchrun's options, the folder, and the environment preflight
found. Pure: from the report, the nodes' facts and the options to a Plan; nothing runs here."""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from ddp_preflight.node.placement import placement
from ddp_preflight.node.redact import redact_argv, redact_env
from ddp_preflight.preflight.cluster import Target
from ddp_preflight.preflight.model import Context, NodeFacts, Options, Report
from ddp_preflight.rules.environment import env_of
from ddp_preflight.rules.facts import Missing
from ddp_preflight.rules.routes import route_to_master, toward_master  # the rule interface-choice applies
from ddp_preflight.rules.torch_install import wanted_torch

IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


class PlanError(Exception):
    """Bad input for a launch: one line that names the node (when there is one) and the fix."""


@dataclass(frozen=True)
class Command:
    """The training command after `--`: a script (or a module with -m) and the script's own options."""
    script: str
    module: bool = False
    args: tuple[str, ...] = ()

    def words(self) -> list[str]:
        return [*(["-m"] if self.module else []), self.script, *self.args]


@dataclass(frozen=True)
class NodePlan:
    node: str
    node_rank: int
    python: str                        # the node's training Python: it runs torchrun
    cwd: str                           # where torchrun (and so every rank) starts
    env: Mapping[str, str]             # set on top of the node's own environment
    env_sources: Mapping[str, str]     # variable -> why: "interface-choice", "omp-threads", "--env",
                                       # "--env worker1:", "config [env]", "config [nodes.worker1.env]"
    torchrun: tuple[str, ...]          # after `python -m torch.distributed.run`; the script's options after --
    ranks: tuple[int, ...]             # global ranks, local rank order
    torch_pip: str = "torch"           # pip's arguments for the master's torch there (rules/torch_install.py)
    data_dir: str | None = None        # the node's data folder, judged by its supervisor before torchrun

    def __post_init__(self):
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        object.__setattr__(self, "env_sources", MappingProxyType(dict(self.env_sources)))

    def command_line(self) -> str:
        """The same start, as a line to paste into a shell on the node, secrets redacted (it is
        shown and logged; the real values travel to the node only)."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in redact_env(dict(self.env)).items())
        run = shlex.join(redact_argv([self.python, "-m", "torch.distributed.run", *self.torchrun]))
        return f"cd {shlex.quote(self.cwd)} && " + (f"{env} {run}" if env else run)

    @property
    def first_rank(self) -> int:
        """The global rank of its local rank 0."""
        return self.ranks[0]

    def to_json(self) -> dict:
        """What plan.json keeps, secrets redacted."""
        return {"node": self.node, "node_rank": self.node_rank, "python": self.python, "cwd": self.cwd,
                "env": redact_env(dict(self.env)), "env_sources": dict(self.env_sources),
                "torchrun": redact_argv(list(self.torchrun)), "ranks": list(self.ranks),
                "command": self.command_line()}


@dataclass(frozen=True)
class Plan:
    nodes: tuple[NodePlan, ...]        # in host order: nodes[0] is the master
    nproc_per_node: int
    master_addr: str                   # as every worker dials it, on the interface preflight chose
    master_port: int
    backend: str
    command: Command
    flight_recorder: bool = True       # every rank's Flight Recorder readable by hangwatch (node/flight.py)

    @property
    def ranks_per_node(self) -> dict[str, int]:
        """Each node's count of ranks (a hostfile's slots may give each its own)."""
        return {n.node: len(n.ranks) for n in self.nodes}

    @property
    def uniform_nproc(self) -> int | None:
        """The ranks every node runs, None where their counts differ."""
        counts = set(self.ranks_per_node.values())
        return counts.pop() if len(counts) == 1 else None

    @property
    def world_size(self) -> int:
        return sum(len(n.ranks) for n in self.nodes)

    def rank(self, node: str, local_rank: int) -> int:
        """As torchrun numbers them: node after node in node-rank order, each node's ranks in a row
        (its first, then its local rank): node_rank x nproc_per_node + local_rank where every node
        runs as many, and the ranks of the nodes before it where their counts differ."""
        plan = next(n for n in self.nodes if n.node == node)
        return plan.first_rank + local_rank

    def where(self, rank: int) -> tuple[str, int]:
        """(node, local_rank) of a global rank."""
        plan = next(n for n in self.nodes if rank in n.ranks)
        return plan.node, rank - plan.first_rank

    def to_json(self) -> dict:
        return {"nnodes": len(self.nodes), "nproc_per_node": self.uniform_nproc,
                "ranks_per_node": self.ranks_per_node,
                "world_size": self.world_size, "master_addr": self.master_addr,
                "master_port": self.master_port, "backend": self.backend,
                "command": redact_argv(self.command.words()), "flight_recorder": self.flight_recorder,
                "nodes": [n.to_json() for n in self.nodes]}


def parse_command(launch_args: Sequence[str]) -> Command:
    """`train.py ARGS`, `-m package.train ARGS`; a `--` right after the script is dropped (the
    launcher puts its own there)."""
    args = list(launch_args)
    if not args:
        raise PlanError("--launch needs the training command after --: "
                        "ddp-preflight HOST ... --launch -- train.py [ARGS]")
    module = args[0] in ("-m", "--module")
    if module:
        args = args[1:]
        if not args or args[0].startswith("-"):
            raise PlanError("-m needs a module name: ddp-preflight HOST ... --launch -- -m package.train [ARGS]")
    elif args[0].startswith("-"):
        raise PlanError(f"{args[0]} comes before the script: ddp-preflight sets torchrun's options itself "
                        "(--nnodes, --nproc-per-node, --node-rank, --master-addr, --master-port); "
                        "start the command with the script: -- train.py [ARGS]")
    script, rest = args[0], args[1:]
    first = posixpath.basename(script)
    if first in ("torchrun", "python", "python3") or re.fullmatch(r"python3(\.\d+)?", first):
        raise PlanError(f"the command starts with {script}: give the script itself (-- train.py [ARGS]); "
                        "ddp-preflight runs torchrun with each node's training Python (--python)")
    if rest[:1] == ["--"]:
        rest = rest[1:]
    return Command(script, module, tuple(rest))


def build_plan(report: Report, nodes: Sequence[NodeFacts], options: Options, targets: Sequence[Target],
               command: Command, *, cwd: str, flight_recorder: bool = True) -> Plan:
    """One NodePlan per node, in host order. `cwd` is the folder ddp-preflight runs in on the master.
    Each node's environment: preflight's settings, then the training's variables for that node
    (options.env: the config's [env] and [nodes.NAME.env], then --env's), which win."""
    if not nodes:
        raise PlanError("no node to launch on")
    for node in nodes:
        if node.error is not None:
            raise PlanError(f"{node.node} was not reached ({node.error}): fix it, or leave it out of the host list")
    counts = [options.nproc_on(node.node) for node in nodes]
    if min(counts) < 1:
        raise PlanError(f"--nproc-per-node {min(counts)}: give at least 1 process per node")
    master_addr = _master_addr(nodes[0], options)
    if master_addr is None:
        raise PlanError(f"the master's address is not known: pass --master-addr ADDR ({nodes[0].node}'s LAN address)")
    master_code = targets[0].code_dir if targets else None
    plans, first = [], 0
    for node_rank, (node, target) in enumerate(zip(nodes, targets, strict=True)):
        nproc = counts[node_rank]
        env, sources = _node_env(report, node, options)
        given = options.env
        for name, value in given.for_node(node.node).items():
            env[name], sources[name] = value, given.sources(node.node)[name]
        where, script = _placement(command, cwd, master_code, target.code_dir)
        torchrun = ("--nnodes", str(len(nodes)), "--nproc-per-node", str(nproc), "--node-rank", str(node_rank),
                    "--master-addr", master_addr, "--master-port", str(options.master_port),
                    "--rdzv-backend", "static", "--max-restarts", "0", "--tee", "3",
                    *(["-m"] if command.module else []), script, "--", *command.args)
        plans.append(NodePlan(node.node, node_rank, target.python, where, env, sources, torchrun,
                              tuple(range(first, first + nproc)), wanted_torch(nodes[0].parsed.torch, node.parsed.torch),
                              target.data_dir))
        first += nproc
    return Plan(tuple(plans), options.nproc_per_node, master_addr, options.master_port, options.backend, command,
                flight_recorder)


def _master_addr(master: NodeFacts, options: Options) -> str | None:
    """The address the master resolved for itself (what the probes dialled); else the option."""
    route = route_to_master(master)
    return (None if isinstance(route, Missing) else route.address) or options.master_addr


def _result(report: Report, check: str, node: str):
    return next((r for r in report.results if r.check == check and r.node == node), None)


def _node_env(report: Report, node: NodeFacts, options: Options) -> tuple[dict, dict]:
    env: dict[str, str] = {}
    sources: dict[str, str] = {}
    ifname = _interface(report, node, options)
    if ifname:
        var = "NCCL_SOCKET_IFNAME" if options.backend == "nccl" else "GLOO_SOCKET_IFNAME"
        env[var], sources[var] = ifname, "interface-choice"
    threads = _omp_threads(report, node, options)
    if threads is not None:
        env["OMP_NUM_THREADS"], sources["OMP_NUM_THREADS"] = str(threads), "omp-threads"
    return env, sources


def _interface(report: Report, node: NodeFacts, options: Options) -> str | None:
    """interface-choice's pick for this node; without that result (--only), the same rule."""
    result = _result(report, "interface-choice", node.node)
    if result is not None:
        env = result.details.get("env") or {}
        name = next((env[v] for v in IFNAME_VARS if env.get(v)), None)
    else:
        iface = toward_master(Context((node,), options), node)
        name = iface.name if iface else None
    return None if name in (None, "lo") else name


def _omp_threads(report: Report, node: NodeFacts, options: Options) -> int | None:
    """On CPU, when the node does not set OMP_NUM_THREADS itself: cores / processes (omp-threads'
    advice), not torchrun's 1. A node's own setting passes through untouched."""
    if options.device != "cpu":
        return None
    if "OMP_NUM_THREADS" in env_of(node):
        return None
    result = _result(report, "omp-threads", node.node)
    if result is not None and result.details.get("recommended"):
        return int(result.details["recommended"])
    cpu = node.parsed.cpu
    if isinstance(cpu, Missing):
        return None
    cores = min(cpu.physical_cores, cpu.usable_cores or cpu.physical_cores)
    return max(1, cores // max(1, options.nproc_on(node.node))) if cores else None


def _placement(command: Command, cwd: str, master_code: str | None, node_code: str | None) -> tuple[str, str]:
    """(folder to start in, script path) on one node: node/placement.py's rule, which preflight's
    training-imports follows on the node too."""
    return placement(command.script, command.module, cwd, master_code, node_code)
