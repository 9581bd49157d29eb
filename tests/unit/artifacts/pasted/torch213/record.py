"""Records what torch 2.13 prints for each failure kind explain reads, from a real two-rank Gloo
job on this box (fail_train.py under torchrun), plus the store's client timeout and a master port
in use: python record.py writes MODE.log here (torchrun's stdout and stderr, as a terminal shows
them). Each log is a real artifact; test_explain_pasted.py asserts explain's verdict on each."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable
TORCHRUN = [PYTHON, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2", "--master-addr=127.0.0.1"]
STORE_TIMEOUT = """
import datetime, torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=1, world_size=2,
                        timeout=datetime.timedelta(seconds=3))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def record(name: str, command: list[str], env: dict | None = None) -> None:
    run = subprocess.run(command, cwd=HERE, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, timeout=180)
    (HERE / f"{name}.log").write_bytes(run.stdout)
    print(f"{name}: exit {run.returncode}, {len(run.stdout.splitlines())} lines")


def main() -> None:
    for mode in ("sigkill", "segv", "abort", "raise", "exit", "unsupported"):
        record(mode, TORCHRUN + [f"--master-port={free_port()}", "fail_train.py", mode])
    record("mismatch", TORCHRUN + [f"--master-port={free_port()}", "fail_train.py", "mismatch"],
           {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    with socket.socket() as held:            # another process holds the master port
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        record("port-in-use", TORCHRUN + [f"--master-port={port}", "fail_train.py", "exit"])
    record("store-timeout", [PYTHON, "-c", STORE_TIMEOUT.format(port=free_port())])


if __name__ == "__main__":
    main()
