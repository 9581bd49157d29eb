"""Run a small script under torchrun on every node at once, the way training will run:
the training Python, the interface preflight chose, the master's address and port.

The script travels inside the command (no files left on the nodes); each node's supervisor
bounds the job and kills its process group, ranks included, when it ends or times out."""

from __future__ import annotations

import base64
from dataclasses import dataclass

from ..model import NodeFacts, Options
from .jobs import JobResult

# On the node: write the script to a temporary file, run torchrun in this process, remove it.
_BOOT = """\
import base64, os, sys, tempfile
fd, path = tempfile.mkstemp(prefix="ddp-preflight-probe-", suffix=".py")
os.write(fd, base64.b64decode(sys.argv[1])); os.close(fd)
try:
    from torch.distributed.run import main
    at = sys.argv.index("--script-args")     # torchrun's options, then the script, then its own
    main(sys.argv[2:at] + [path] + sys.argv[at + 1:])
finally:
    os.unlink(path)
"""


@dataclass(frozen=True)
class TorchJob:
    script: str                   # the probe's Python source; it prints its own marked JSON lines
    args: tuple[str, ...] = ()    # the script's options
    nproc_per_node: int = 1
    timeout: float = 60.0         # the whole job, per node
    port: int | None = None       # default: the run's master port


def node_env(node: NodeFacts, options: Options) -> dict:
    """The per-node environment training would get: the interface toward the master."""
    from ..checks.network import toward_master   # the same choice interface-choice reports
    from ..model import Context

    env = {"OMP_NUM_THREADS": "1"}
    ctx = Context((node,), options)
    iface = toward_master(ctx, node)
    if iface is not None and iface.get("name") != "lo":
        env["NCCL_SOCKET_IFNAME" if options.backend == "nccl" else "GLOO_SOCKET_IFNAME"] = iface["name"]
    return env


def run(cluster, nodes: tuple[NodeFacts, ...], options: Options, job: TorchJob,
        indexes: list[int] | None = None, extra_env: dict | None = None) -> list[JobResult]:
    """Start the job on the given nodes (default: all usable, master first) and wait for all."""
    indexes = indexes if indexes is not None else [i for i in cluster.usable() if nodes[i].error is None]
    master_ip = ((nodes[0].facts.get("network") or {}).get("route_to_master") or {}).get("address") \
        or options.master_addr
    payload = base64.b64encode(job.script.encode()).decode()
    running = []
    for rank, i in enumerate(indexes):
        argv = [cluster.nodes[i].python, "-c", _BOOT, payload,
                "--nnodes", str(len(indexes)), "--nproc-per-node", str(job.nproc_per_node),
                "--node-rank", str(rank), "--master-addr", str(master_ip),
                "--master-port", str(job.port or options.master_port), "--max-restarts", "0",
                "--script-args", *job.args]
        env = {**node_env(nodes[i], options), **(extra_env or {})}
        running.append(cluster.start(i, argv, env=env, timeout=job.timeout))
    return [r.wait(job.timeout + 30) for r in running]


def marked(results: list[JobResult], marker: str) -> list[dict]:
    """Every JSON line the ranks printed with `marker`, across nodes."""
    out = []
    for result in results:
        out += result.json_lines(marker)
    return out


def tail(result: JobResult, lines: int = 5) -> str:
    text = (result.stderr or result.stdout).strip().splitlines()
    return " | ".join(text[-lines:])[-600:]
