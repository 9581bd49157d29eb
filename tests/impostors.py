"""Processes that pose as training ranks, started by another user (tests/hostile.py's intruder), as
issue 23's attack 9 does: a Python named like torchrun's ranks, with RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT in its environment, sitting in `init_process_group` (as py-spy sees
it: a function of that name in a file under torch/distributed/) and connected to a "store" that
accepts its connection and never answers. The intruder needs no torch: the names are its own to
choose, and it runs the system's Python.

    crowd = start(intruder, 6, host="127.0.0.1", world=4)   # six impostors, six silent stores
    crowd.pids, crowd.ports
    crowd.stop()

`wrap` turns an argv into the command that runs it as the intruder where it must run (a lab node:
its network namespace, then the intruder's uid); without it the intruder's own Popen is used."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .hostile import Intruder

PYTHON = "/usr/bin/python3"       # the system's: the intruder cannot run the test's venv

# Listens on `count` ports of `host`, says which, takes every connection and never answers.
SILENT_STORE = r"""
import json, socket, sys, threading
host, count = sys.argv[1], int(sys.argv[2])
servers = [socket.create_server((host, 0)) for _ in range(count)]
held = []
def take(server):
    while True:
        conn, _ = server.accept()
        held.append(conn)
for server in servers:
    threading.Thread(target=take, args=(server,), daemon=True).start()
print(json.dumps([s.getsockname()[1] for s in servers]), flush=True)
threading.Event().wait()
"""

# The impostor's own "torch": init_process_group connects to MASTER_ADDR:MASTER_PORT and waits
# for an answer that never comes, as a rank whose store is silent does.
FAKE_C10D = r"""
import os, socket, time


def init_process_group(backend=None, **kwargs):
    return _create_c10d_store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))


def _create_c10d_store(host, port):
    store = socket.create_connection((host, port))
    while store.recv(1):
        pass
    time.sleep(3600)
"""

TRAIN = r"""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch.distributed as dist
print("impostor waiting", flush=True)
dist.init_process_group("gloo")
"""


@dataclass
class Crowd:
    folder: Path
    listener: subprocess.Popen
    ports: list[int]
    procs: list[subprocess.Popen] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)     # the impostors' own (their Python, not a wrapper)
    launchers: list[int] = field(default_factory=list)   # the fake torchruns' pids

    def stop(self) -> None:
        """Each process this crowd started, by its pid; then its folder."""
        for p in [*self.procs, self.listener]:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait(10)
        shutil.rmtree(self.folder, ignore_errors=True)


def launcher_pid(pid: int) -> int:
    return impostor_pid(pid, lambda argv: b"torchrun" in argv)


def impostor_pid(pid: int, match: Callable[[list[bytes]], bool] | None = None, timeout: float = 10.0) -> int:
    """The Python at the end of a wrapper chain (ip netns exec, unshare, sh, setpriv exec in place;
    some fork): the first process under `pid` whose command line runs train.py (or matches)."""
    match = match or (lambda argv: len(argv) > 2 and argv[2].endswith(b"/train.py"))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stack = [pid]
        while stack:
            p = stack.pop()
            try:
                argv = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[0] == PYTHON.encode() and match(argv):
                return p
            try:
                children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
            except OSError:
                children = []
            stack.extend(int(c) for c in children)
        time.sleep(0.05)
    raise TimeoutError(f"no impostor Python under pid {pid}")


def plant(intruder: Intruder) -> Path:
    """The impostor's files, in a fresh folder of the intruder's home (its own)."""
    folder = intruder.folder(intruder.home / f"impostors-{secrets.token_hex(4)}", 0o755)
    package = intruder.folder(folder / "torch", 0o755)
    distributed = intruder.folder(package / "distributed", 0o755)
    intruder.file(package / "__init__.py", "")
    intruder.file(distributed / "__init__.py", "from .distributed_c10d import init_process_group\n")
    intruder.file(distributed / "distributed_c10d.py", FAKE_C10D)
    intruder.file(folder / "train.py", TRAIN)
    intruder.file(folder / "silent_store.py", SILENT_STORE)
    return folder


def start(intruder: Intruder, count: int, *, host: str, world: int, launchers: int = 0,
          wrap: Callable[[list[str]], list[str]] | None = None) -> Crowd:
    """`count` impostors (ranks 0.. of a world of `world`, each pointing at a silent store of its
    own on `host`), waiting in their init_process_group when this returns; and `launchers` fake
    torchruns (a Python whose command line says torchrun, node rank 0 of 2, and a silent store)
    that start no rank, as a torchrun waiting for the other nodes' does."""
    folder = plant(intruder)

    def popen(argv: list[str], env: dict) -> subprocess.Popen:
        if wrap is None:
            return intruder.popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                  start_new_session=True)
        return subprocess.Popen(wrap(["env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]),
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)

    listener = popen([PYTHON, str(folder / "silent_store.py"), host, str(count)], intruder.env())
    assert listener.stdout is not None
    ports = json.loads(listener.stdout.readline())
    crowd = Crowd(folder, listener, ports)
    try:
        for i, port in enumerate(ports):
            rank = i % world
            env = {**intruder.env(), "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                   "MASTER_ADDR": host, "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
            crowd.procs.append(popen([PYTHON, "-u", str(folder / "train.py")], env))
        for p in crowd.procs:
            assert p.stdout is not None and p.stdout.readline() == "impostor waiting\n"
            crowd.pids.append(impostor_pid(p.pid))
        for _ in range(launchers):
            fake = popen([PYTHON, "-c", "print('torchrun waiting', flush=True); import time; time.sleep(3600)",
                          "torchrun", "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", str(world),
                          "--master-addr", host, "--master-port", str(ports[0]), "train.py"], intruder.env())
            crowd.procs.append(fake)
            assert fake.stdout is not None and fake.stdout.readline() == "torchrun waiting\n"
            crowd.launchers.append(launcher_pid(fake.pid))
    except BaseException:
        crowd.stop()
        raise
    return crowd


def as_intruder(intruder: Intruder) -> list[str]:
    """The prefix that runs a command as the intruder (no supplementary groups), for `wrap`."""
    return ["setpriv", f"--reuid={intruder.uid}", f"--regid={intruder.gid}", "--clear-groups"]
