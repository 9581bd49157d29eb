"""OS, Python, CPU, memory, environment, clock."""

from __future__ import annotations

import os
import platform
import socket
import sys

from ..proc import read
from ..redact import redact_env

# Variables that decide how training binds, threads and picks dtypes. Prefixes match many.
ENV_PREFIXES = ("GLOO_", "NCCL_", "TORCH_", "OMP_", "MKL_", "MASTER_", "NANOCHAT_", "TP_",
                "CUDA_VISIBLE_DEVICES", "WORLD_SIZE", "RANK", "LOCAL_RANK", "PYTORCH_",
                "DTYPE", "COMPUTE_DTYPE")


def os_facts() -> dict:
    release = {}
    for line in (read("/etc/os-release", "") or "").splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            release[k] = v.strip('"')
    # One kernel, one boot: nodes that are containers or namespaces of one machine share it, and
    # so share its CPUs (compute-balance compares their cores as one machine's).
    boot_id = (read("/proc/sys/kernel/random/boot_id", "") or "").strip() or None
    return {"system": platform.system(), "kernel": platform.release(),
            "distro": release.get("PRETTY_NAME"), "machine": platform.machine(),
            "hostname": socket.gethostname(), "boot_id": boot_id}


def python_facts() -> dict:
    return {"version": platform.python_version(), "implementation": platform.python_implementation(),
            "executable": sys.executable, "prefix": sys.prefix,
            "venv": sys.prefix != getattr(sys, "base_prefix", sys.prefix)}


BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_facts() -> dict:
    info = read("/proc/cpuinfo", "") or ""
    model = None
    flags: set = set()
    cores: set = set()
    physical_id = core_id = None
    for line in info.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "model name" and model is None:
            model = value
        elif key == "flags" and not flags:
            flags = set(value.split())
        elif key == "physical id":
            physical_id = value
        elif key == "core id":
            core_id = value
        elif not line.strip() and core_id is not None:
            cores.add((physical_id, core_id))
            physical_id = core_id = None
    if core_id is not None:
        cores.add((physical_id, core_id))
    logical = os.cpu_count() or 1
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = logical
    # The last minute's mean of runnable processes, and how many are runnable now (this one
    # included): a load that began seconds ago is in the second before the first says it.
    fields = (read("/proc/loadavg", "") or "").split()
    load: float | None
    runnable: int | None
    try:
        load, runnable = float(fields[0]), int(fields[3].split("/")[0])
    except (IndexError, ValueError):
        load = runnable = None
    return {"model": model, "logical_cores": logical, "usable_cores": usable, "load_1m": load,
            "runnable": runnable,
            "physical_cores": len(cores) or logical,
            "flags": sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "sse4"))),
            "bf16_instructions": sorted(f for f in BF16_FLAGS if f in flags)}


def memory_facts() -> dict:
    values = {}
    for line in (read("/proc/meminfo", "") or "").splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable"):
            values[key] = int(rest.split()[0]) * 1024
    return {"total_bytes": values.get("MemTotal"), "available_bytes": values.get("MemAvailable")}


def env_facts() -> dict:
    """The variables that decide how training binds, threads and picks dtypes (secrets hidden)."""
    picked = {key: value for key, value in os.environ.items() if key.startswith(ENV_PREFIXES)}
    return {"vars": dict(sorted(redact_env(picked).items()))}
