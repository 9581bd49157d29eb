"""Collect every node's facts in parallel: one unreachable node never stops the others."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ddp_preflight.node.facts.network import interfaces, route_to
from ddp_preflight.node.facts.shards import ALGORITHMS
from ddp_preflight.transport import LocalNode, Node, NodeError, RunningJob, SshNode
from ddp_preflight.transport.node import OnLine, Progress
from ddp_preflight.transport.slurm import SlurmJob, SlurmNode, SlurmStep

from .checks.reachability import DIALLED
from .hosts import bad_host_reason
from .model import NodeFacts

MAX_PARALLEL = 32


@dataclass(frozen=True)
class Target:
    """A node to check, with its own settings (from the command line or the config)."""
    name: str
    python: str
    data_dir: str | None = None
    code_dir: str | None = None
    local: bool = False


class Cluster:
    """The nodes of one preflight, each with its SSH connection kept open from the facts to the
    probes. Use it as a context manager: leaving it closes every connection."""

    def __init__(self, targets: list[Target], ssh_config: str | None, slurm_job: SlurmJob | None = None):
        self.targets = list(targets)
        self.slurm_job = slurm_job      # Slurm's view of the job, for the checks that read it
        self.nodes: list[Node]
        if slurm_job is not None and targets:
            # Inside a Slurm job: every node through one srun step (transport/slurm.py), not ssh.
            step = SlurmStep(slurm_job, targets[0].python)
            self.nodes = [SlurmNode(t.name, t.python, step) for t in targets]
        else:
            self.nodes = [LocalNode(t.name, t.python) if t.local else SshNode(t.name, t.python, ssh_config)
                          for t in targets]
        self.errors: list[NodeError | None] = [None] * len(self.nodes)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        for node in self.nodes:
            try:
                node.close()
            except Exception:
                pass

    def usable(self) -> list[int]:
        """Indexes of the nodes that were reached and ran the collector."""
        return [i for i, e in enumerate(self.errors) if e is None]

    def job(self, i: int, job: dict, *, env: dict | None = None, timeout: float = 60, lease: float | None = None,
            cwd: str | None = None, on_line: OnLine | None = None) -> RunningJob:
        """A supervised node program on node i (ddp_preflight/node/supervisor.py), with that node's Python."""
        return self.nodes[i].job(job, env=env, timeout=timeout, lease=lease, cwd=cwd, on_line=on_line)


def gather(cluster: Cluster, request: dict, on_progress: Progress | None = None,
           env: Mapping[str, Mapping[str, str]] | None = None) -> tuple[list[NodeFacts], str | None]:
    """Returns each node's facts (in the order given) and the master address workers dial.

    `request` goes to every node's collector: master_port, master_addr (None: the master's
    address as the ssh config names it), launch_args, nnodes, nproc_per_node. `env`: the
    training's variables per node (--env, the config's); each node's collector runs with its own,
    so what it reads (the environment, the address Gloo binds, torch's devices) is what the
    training will see. They travel on the program's stdin, like every spec."""
    master_addr = request.get("master_addr")
    targets, nodes, errors = cluster.targets, cluster.nodes, cluster.errors
    facts: list[dict | None] = [None] * len(nodes)

    def guarded(i: int, fn) -> None:
        if errors[i] is not None:
            return
        try:
            fn()
        except NodeError as exc:
            errors[i] = exc
        except Exception as exc:   # an unexpected failure is still one node's error
            errors[i] = NodeError(f"{targets[i].name}: {type(exc).__name__}: {exc}")

    for i, target in enumerate(targets):
        reason = bad_host_reason(target.name)
        if reason and not target.local:
            errors[i] = NodeError(reason, "fix the host list; nothing was run for this entry")

    with ThreadPoolExecutor(min(MAX_PARALLEL, len(nodes))) as pool:
        # Connect first: the master's address (as the ssh config names it) goes to the workers.
        list(pool.map(lambda i: guarded(i, nodes[i].connect), range(len(nodes))))
        if master_addr is None and errors[0] is None:
            master_addr = nodes[0].address

        def phase_facts(i: int) -> None:
            # Shards are hashed in the same pass, with the node's best algorithm; a node
            # whose algorithm the others lack is hashed again below, with a common one.
            node_request = {**request, "sections": ["facts", "shards"], "master_addr": master_addr,
                            "code_dir": targets[i].code_dir, "is_master": i == 0,
                            "data_dir": targets[i].data_dir, "hash_algorithm": "best",
                            "env": dict((env or {}).get(targets[i].name) or {})}
            result = nodes[i].collect(node_request, on_progress)
            result["reached_at"] = nodes[i].address
            facts[i] = result

        list(pool.map(lambda i: guarded(i, lambda: phase_facts(i)), range(len(nodes))))

        with_data = {i: found for i, (t, found) in enumerate(zip(targets, facts, strict=True))
                     if t.data_dir and found is not None}
        algorithm = common_algorithm(list(with_data.values())) if with_data else None
        again = [i for i, found in with_data.items()
                 if (found.get("shards") or {}).get("algorithm") not in (None, algorithm)]

        def rehash(i: int) -> None:
            shard_request = {"sections": ["shards"], "data_dir": targets[i].data_dir,
                             "hash_algorithm": algorithm}
            with_data[i]["shards"] = nodes[i].collect(shard_request, on_progress).get(
                "shards", {"error": "the collector returned no shard manifest"})

        list(pool.map(lambda i: guarded(i, lambda: rehash(i)), again))

    out = []
    for target, error, found in zip(targets, errors, facts, strict=True):
        if error is not None and found is None:
            out.append(NodeFacts(target.name, dialled_from_here(error), error.summary, error.fix))
        else:
            result = found or {}
            if error is not None:    # facts came, a later phase failed on this node
                result.setdefault("shards", {"error": error.summary})
            out.append(NodeFacts(target.name, result))
    return out, master_addr


def dialled_from_here(error: NodeError) -> dict:
    """Where nothing answered this machine's dial (ssh timed out, no route to host): this
    machine's interfaces and its kernel's route to that address, in a node's network facts'
    shape, so node-reachable can judge whether this machine's own routing lost it."""
    if not error.unanswered:
        return {}
    return {DIALLED: {"interfaces": interfaces(), "route_to_master": route_to(error.unanswered)}}


def common_algorithm(all_facts: list[dict]) -> str:
    """The fastest hash every node can compute, so digests compare across nodes."""
    available = None
    for facts in all_facts:
        have = set((facts.get("hash_algorithms") or {}).get("available") or ["blake2b"])
        available = have if available is None else available & have
    for name in ALGORITHMS:
        if name in (available or set()):
            return name
    return "blake2b"
