"""The programs a node runs, by name: one table. boot.py calls `run(spec, folder, zip_path)`.

Each program is `main(spec, work) -> exit code`, where `work` says where it runs (its private
folder and the package's zip, for the children it starts)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

PROGRAMS = {
    "facts": "node.facts.main",            # preflight's collectors: one FACTS line
    "supervise": "node.supervisor",        # a job in its own process group, bounded (probes, launch)
    "netprobe": "node.netprobe",           # listen on, or connect to, the ports Gloo will use
    "torchjob": "node.torchjob",           # torchrun in this process with one of node.jobs
    "compute": "node.jobs.compute",        # a matmul benchmark (compute-balance)
    "launch": "node.launch_runner",        # torchrun with the training script
    "bind-check": "node.bindcheck",        # can this port be bound now
    "agent": "node.agent",                 # hangwatch's agent: the ranks, their CPU, stacks, exits
    "receive": "node.receive",             # a file from the master, kept in a private folder
    "pathmtu": "node.pathmtu",             # the largest don't-fragment packet that reaches each other node
    "relay": "node.relay",                 # one per node of a Slurm step: the node's programs over srun
}


@dataclass(frozen=True)
class Work:
    folder: str       # private (0700), removed when the program ends
    zip_path: str     # the node package, for children that need it


def run(spec: dict, folder: str, zip_path: str) -> int:
    name = spec.get("program")
    if name not in PROGRAMS:
        import sys
        sys.stderr.write(f"ddp-preflight node: no program {name!r} (a different version on each side?)\n")
        return 2
    module = importlib.import_module(PROGRAMS[name])
    return module.main(spec, Work(folder, zip_path)) or 0


def child() -> None:
    """A program the supervisor started: the zip is argv[1], the spec all of stdin; it works in
    the supervisor's private folder (the supervisor removes it)."""
    import json
    import os
    import sys

    raw = b""
    while True:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            break
        raw += chunk
    spec = json.loads(raw.decode("utf-8"))
    code = run(spec, spec.get("work") or os.getcwd(), sys.argv[1])
    sys.stdout.flush()
    sys.exit(code)
