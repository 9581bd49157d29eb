"""Run a probe job under torchrun on every node at once, the way training will run: the
training Python, the interface preflight chose, the master's address and port.

The job is one of node/jobs (node/torchjob.py starts torchrun there with it); each node's
supervisor bounds the job and kills its process group, ranks included, when it ends, times out,
or the master goes away. Nothing is left on the nodes.

The job's rendezvous store answers whoever reaches the master's port: each job gets a token of
its own (on every node's stdin), its values are signed with it (node/jobs/signed_store.py), and
a value no process of the job wrote makes the probe say "interfered" (`interfered`)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from ddp_preflight.node import protocol
from ddp_preflight.rules.facts import Missing
from ddp_preflight.rules.routes import route_to_master, toward_master  # the choice interface-choice reports
from ddp_preflight.transport import JobResult

from ..model import Context, NodeFacts, Options
from .job_end import ended_by_us_or_outside, slowdown, why_ended


@dataclass(frozen=True)
class TorchJob:
    job: str                      # one of node/jobs: it prints its own marked JSON lines
    args: tuple[str, ...] = ()    # the job's options
    counts: tuple[int, ...] = ()  # ranks on each node it runs on, in their order (default: one each)
    timeout: float = 60.0         # the whole job, per node
    port: int | None = None       # default: the run's master port


def preflight_env(node: NodeFacts, options: Options) -> dict:
    """What preflight itself would set on the node: the interface toward the master (the pin
    interface-choice reports), one thread per rank for the probes' tiny tensors."""
    env = {"OMP_NUM_THREADS": "1"}
    iface = toward_master(Context((node,), options), node)
    if iface is not None and iface.name != "lo":
        env["NCCL_SOCKET_IFNAME" if options.backend == "nccl" else "GLOO_SOCKET_IFNAME"] = iface.name
    return env


def node_env(node: NodeFacts, options: Options) -> dict:
    """The environment a probe job gets on the node, as the launch gives it to training:
    preflight's settings, then the training's own variables for that node (the config's [env]
    and [nodes.NAME.env], --env and --env NODE:), which win, as they do in launch/plan.py."""
    return {**preflight_env(node, options), **options.env.for_node(node.node)}


def run(cluster, nodes: tuple[NodeFacts, ...], options: Options, job: TorchJob,
        indexes: list[int] | None = None, extra_env: dict | None = None) -> list[JobResult]:
    """Start the job on the given nodes (default: all usable, master first) and wait for all."""
    indexes = indexes if indexes is not None else [i for i in cluster.usable() if nodes[i].error is None]
    # Its bound, and the master's wait, grow with the busiest node's load (job_end.slowdown).
    bound = job.timeout * slowdown(nodes[i] for i in indexes)
    route = route_to_master(nodes[0])
    master_ip = (None if isinstance(route, Missing) else route.address) or options.master_addr
    token = secrets.token_hex(16)      # this job's alone: every value in its store is signed with it
    running = []
    for rank, i in enumerate(indexes):
        torchrun = ["--nnodes", str(len(indexes)), "--nproc-per-node", str(job.counts[rank] if job.counts else 1),
                    "--node-rank", str(rank), "--master-addr", str(master_ip),
                    "--master-port", str(job.port or options.master_port), "--max-restarts", "0"]
        spec = {"program": "torchjob", "job": job.job, "torchrun": torchrun, "args": list(job.args),
                # The rendezvous store listens on the master's address alone.
                "bind": master_ip if rank == 0 else None, "store_token": token}
        # extra_env: what a probe sets on purpose over the training's (each caller says why).
        env = {**node_env(nodes[i], options), **(extra_env or {})}
        running.append(cluster.job(i, spec, env=env, timeout=bound))
    return [r.wait(bound + 30) for r in running]


def marked(results: list[JobResult], marker: str) -> list[dict]:
    """Every JSON line the ranks printed with `marker`, across nodes."""
    out = []
    for result in results:
        out += result.json_lines(marker)
    return out


def interfered(results: list[JobResult], port: int) -> str | None:
    """Why the probe cannot say anything, when a process of the job read a value of its store
    that none of them wrote: one line, with how to find the stranger."""
    for result in results:
        for seen in result.json_lines(protocol.INTERFERED):
            return (f"interfered: the probe's rendezvous store (port {port}) held a value of "
                    f"{seen.get('key')!r} that no process of this run wrote ({seen.get('by')} on {result.node} "
                    f"read it), so its figures would not be this run's; find who connects to the port "
                    f"(ss -tnp 'sport = :{port}' on the master) and run again")
    return None


def tail(result: JobResult, lines: int = 5) -> str:
    text = (result.stderr or result.stdout).strip().splitlines()
    return " | ".join(text[-lines:])[-600:]


def job_error(result: JobResult) -> str:
    """Why a job failed, in the backend's own words where a rank printed them."""
    if result.error:
        return result.error
    if result.timed_out:
        return f"killed at its bound after {result.seconds:.0f} s"
    if ended_by_us_or_outside(result):     # a stop or a signal: who ended it, not torchrun's SignalException
        return why_ended(result)
    return exception_line(result.stderr) or tail(result) or f"exit {result.exit}, no output"


def exception_line(stderr: str) -> str | None:
    """The exception the job died of: a rank's as torchrun relays it ("[rank1]: torch.distributed.
    DistBackendError: NCCL error in: ..."), or torchrun's own (a rendezvous that timed out), never
    its empty ChildFailedError. NCCL puts its cause on a later line ("Last error:", then
    "Duplicate GPU detected : ..."): that is kept."""
    lines = [_unprefixed(line) for line in stderr.splitlines()]
    for at in range(len(lines) - 1, -1, -1):
        head = lines[at].split(":", 1)[0].strip()
        if head.endswith(("Error", "Exception", "Timeout")) and "ChildFailedError" not in head and " " not in head:
            error = lines[at].strip()
            after = lines[at + 1:at + 4]
            if "Last error:" in after[:-1]:
                error += f"; Last error: {after[after.index('Last error:') + 1].strip()}"
            return error[:600]
    return None


def _unprefixed(line: str) -> str:
    """A rank's line without torchrun's "[rank1]:" in front."""
    if line.startswith("[rank") and "]:" in line:
        return line.split("]:", 1)[1].lstrip(" ")
    return line
