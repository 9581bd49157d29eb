"""Run a DDP job across lab nodes over the lab's real sshd, the way a user would."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

JOB = Path(__file__).parents[2] / "examples" / "allreduce.py"


@dataclass
class RankOutcome:
    node: str
    returncode: int
    result: dict          # the job's JSON line, or {} if it printed none
    output: str


def ssh(lab, node: str, command: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["ssh", "-F", str(lab.ssh_config), node, command],
                          capture_output=True, text=True, timeout=timeout)


def run_job(lab, nodes: list[str], *, port: int = 29500, pg_timeout: float = 30,
            torchrun: bool = False, timeout: float = 120) -> list[RankOutcome]:
    master = lab.node(nodes[0])
    python = shlex.quote(sys.executable)

    def one(rank: int) -> RankOutcome:
        env = f"PG_TIMEOUT={pg_timeout}"
        if torchrun:
            command = (f"{env} {python} -m torch.distributed.run --nnodes {len(nodes)} "
                       f"--nproc-per-node 1 --node-rank {rank} --master-addr {master.ipv4} "
                       f"--master-port {port} {shlex.quote(str(JOB))}")
        else:
            command = (f"{env} RANK={rank} WORLD_SIZE={len(nodes)} MASTER_ADDR={master.ipv4} "
                       f"MASTER_PORT={port} {python} {shlex.quote(str(JOB))}")
        done = ssh(lab, nodes[rank], command, timeout=timeout)
        result = {}
        for line in done.stdout.splitlines():
            if line.startswith("{"):
                result = json.loads(line)
        return RankOutcome(nodes[rank], done.returncode, result, done.stdout + done.stderr)

    with ThreadPoolExecutor(len(nodes)) as pool:
        return list(pool.map(one, range(len(nodes))))
