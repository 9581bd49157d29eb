"""The programs a node runs, by name: one table. boot.py calls `run(spec, folder, zip_path)`.

Each program is `main(spec, work) -> exit code`, where `work` says where it runs (its private
folder and the package's zip, for the children it starts).

Before it runs, the program takes its key out of the spec (node/signing.py: every marked line it
writes is signed with it) and makes itself not dumpable: another process of its user (a rank it
started, among them) can then neither open its /proc/PID/fd/N, nor read its memory or
environment. An exec gives that back, so the ranks, py-spy and the collectors' tools are as
they were. (Root reads through it all the same: against a rank that runs as root, the key is
what holds.)"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from . import signing

PROGRAMS = {
    "facts": "ddp_preflight.node.facts.main",            # preflight's collectors: one FACTS line
    "supervise": "ddp_preflight.node.supervisor",        # a job in its own process group, bounded (probes, launch)
    "netprobe": "ddp_preflight.node.netprobe",           # listen on, or connect to, the ports Gloo will use
    "torchjob": "ddp_preflight.node.torchjob",           # torchrun in this process with one of node.jobs
    "compute": "ddp_preflight.node.jobs.compute",        # a matmul benchmark (compute-balance)
    "launch": "ddp_preflight.node.launch_runner",        # torchrun with the training script
    "bind-check": "ddp_preflight.node.bindcheck",        # can this port be bound now
    "agent": "ddp_preflight.node.agent",                 # hangwatch's agent: the ranks, their CPU, stacks, exits
    "receive": "ddp_preflight.node.receive",             # a file from the master, kept in a private folder
    "pathmtu": "ddp_preflight.node.pathmtu",             # the largest don't-fragment packet that reaches each other node
    "relay": "ddp_preflight.node.relay",                 # one per node of a Slurm step: the node's programs over srun
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
    signing.use_key(spec.pop("key", None))
    not_dumpable()
    module = importlib.import_module(PROGRAMS[name])
    return module.main(spec, Work(folder, zip_path)) or 0


PR_SET_DUMPABLE = 4     # linux/prctl.h


def not_dumpable() -> None:
    """prctl(PR_SET_DUMPABLE, 0): this process's /proc entries become root's, so that no other
    process of this user opens its file descriptors (its stdout, its stdin from the master) or
    reads its memory (the key). Defence in depth, where the system lets us: never a failure."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except Exception:
        pass


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
