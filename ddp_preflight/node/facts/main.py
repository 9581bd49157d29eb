"""The facts program on the node: run the requested collectors, print one FACTS line.

Every collector is isolated: an exception becomes {"error": ...} for its section only.
The first line is the node's clock (CLOCK), for clock-skew; shard hashing prints PROGRESS.

The facts die with the master: it keeps this program's stdin open and sends a heartbeat each
second (transport/node.py's collect, "lease" in the request); EOF (the master killed, the link
closed) or silence past the lease (the link down) ends every process it started and this one,
and removes its private folder, wherever a collector is (a git that never answers, a folder on a
hung mount). The program leads its own process group, and ends with what is left in it: a
command killed at its timeout may leave a child of its own behind."""

from __future__ import annotations

import os
import shutil
import sys
import time
import traceback

from .. import protocol
from ..control import Control, end_started, lead_own_group
from . import code, gpu, imports, launch, network, processes, system, torchinfo


def _guard(fn, *args):
    try:
        return fn(*args)
    except Exception as exc:   # a broken collector must not lose the others
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        return {"error": f"{type(exc).__name__}: {exc} (at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})"}


def _progress(done_bytes, total_bytes, done_files, total_files):
    protocol.emit(protocol.PROGRESS, [done_bytes, total_bytes, done_files, total_files])


def collect(request: dict) -> dict:
    sections = request.get("sections") or ["facts"]
    # The training's own variables (--env, the config's) on top of this node's: every collector
    # then reads what the ranks will read (this program is its own process, and ends after).
    os.environ.update({str(k): str(v) for k, v in (request.get("env") or {}).items()})
    out: dict = {"collected_at": time.time(), "version": 1}
    if "facts" in sections:
        env = _guard(system.env_facts)
        env_vars = env.get("vars", {}) if isinstance(env, dict) else {}
        port = int(request.get("master_port") or 29500)
        out.update({
            "os": _guard(system.os_facts), "python": _guard(system.python_facts),
            "cpu": _guard(system.cpu_facts), "memory": _guard(system.memory_facts),
            "gpu": _guard(gpu.gpu_facts), "env": env, "torch": _guard(torchinfo.torch_facts),
            "network": _guard(network.network_facts, request, env_vars),
            "master_port": _guard(processes.port_holders, port),
            "processes": _guard(processes.training_processes, port),
            "ptrace": _guard(processes.ptrace_facts),
        })
        code_facts = _guard(code.code_facts, request.get("code_dir"))
        if code_facts is not None:
            out["code"] = code_facts
        out["hash_algorithms"] = _guard(_hash_algorithms)
        imported = _guard(imports.training_imports, request)
        if imported is not None:
            out["imports"] = imported
        if request.get("launch_args") and request.get("is_master"):
            out["launch"] = _guard(launch.torchrun_parse, request["launch_args"],
                                   int(request.get("nnodes") or 1), int(request.get("nproc_per_node") or 1))
    if "shards" in sections and request.get("data_dir"):
        out["shards"] = _guard(_shards, request)
    return out


def _hash_algorithms():
    from .shards import available_algorithms
    return {"available": available_algorithms()}


def _shards(request: dict):
    from ..loader_env import path_refusal
    from . import shards
    # A data folder another user can change feeds the ranks what they choose: refused, as code is.
    refused = path_refusal("data folder", os.path.expanduser(request["data_dir"]), "read")
    if refused is not None:
        return {"error": f"{refused[0]}; fix: {refused[1]}", "missing": False}
    try:
        cache = shards.default_cache_path(request["data_dir"])
        algorithm = request.get("hash_algorithm") or "best"
        if algorithm == "best":
            algorithm = shards.available_algorithms()[0]
        return shards.manifest(request["data_dir"], algorithm,
                               cache_path=cache, progress=_progress)
    except shards.ShardError as exc:
        return {"error": str(exc), "missing": isinstance(exc, shards.DataDirMissing)}


def main(request: dict, work=None) -> int:
    leads = False
    if "lease" in request:          # a master that keeps our stdin: its line is the lease
        leads = lead_own_group()
        Control(request.get("lease"), on_gone=lambda why: _master_gone(why, work)).start()
    try:
        protocol.emit(protocol.CLOCK, time.time())      # first: the clock sample
        protocol.emit(protocol.FACTS, collect(request))
    finally:
        if leads:
            end_started()       # what a command killed at its timeout left (a stuck git's child)
    return 0


def _master_gone(why: str, work) -> None:
    """The master closed our line or went silent: nothing of this program stays."""
    end_started()
    if work is not None:
        shutil.rmtree(work.folder, ignore_errors=True)
    said = "closed its line" if why == "eof" else "was silent longer than the lease"
    try:
        sys.stderr.write(f"ddp-preflight node: the master {said}: the facts program stopped\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(3)        # not an exception: the main thread may be blocked in a read or a child
