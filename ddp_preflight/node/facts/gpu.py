"""GPUs: whether one is here at all, and on an NVIDIA box what the driver says about each (NVML
through ctypes, else nvidia-smi), who holds their memory, how they connect, which of them the
ranks will see, and the InfiniBand HCAs and nccl.conf settings NCCL will read.

Presence comes first and from /dev alone (seeds 001, 004: a GPU in the box made auto-detection
pick bf16 and flash attention for a CPU run), so it is there whatever the driver answers."""

from __future__ import annotations

import os
import pwd
import re

from ..bounded import Skipped, read_regular
from ..proc import read
from . import nvml, nvsmi
from .processes import describe, own_lineage, training_reasons

# What decides which GPUs a process sees: CUDA's list, and the container runtime's (applied when
# the container started: inside it, the driver already lists only those).
VISIBLE_VARS = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
NCCL_CONF_FILES = ("/etc/nccl.conf",)
NCCL_CONF_BYTES = 64 << 10      # an nccl.conf is a few lines: a larger one is not read


def gpu_facts() -> dict:
    facts = presence()
    facts["visible"] = {name: os.environ.get(name) for name in VISIBLE_VARS}
    facts.update(driver_view())
    for device in facts.get("devices", []):
        device.update(placement(device.get("pci_bus_id")))
    mine = own_lineage()
    facts["processes"] = [holder(p) for p in facts.get("processes", []) if p["pid"] not in mine]
    facts["infiniband"] = infiniband()
    facts["nccl_conf"] = nccl_conf()
    return facts


def presence() -> dict:
    nvidia = sorted(d for d in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", d)) \
        if os.path.isdir("/dev") else []
    driver = read("/proc/driver/nvidia/version")
    return {"nvidia_devices": nvidia, "nvidia_driver": driver.splitlines()[0] if driver else None,
            "amd_kfd": os.path.exists("/dev/kfd")}


def driver_view() -> dict:
    """NVML's answers ("source": "nvml"), else nvidia-smi's, else why neither answered."""
    try:
        library = nvml.Nvml()
    except (OSError, nvml.NvmlError) as exc:
        nvml_failed = f"{nvml.LIBRARY} does not load ({exc})"
    else:
        try:
            return {"source": "nvml", **nvml.collect(library)}
        except Exception as exc:        # a driver answering unlike nvml.h says: nvidia-smi may still
            nvml_failed = f"NVML failed: {type(exc).__name__}: {exc}"
        finally:
            library.close()
    try:
        return {"source": "nvidia-smi", "nvml_failed": nvml_failed, **nvsmi.collect()}
    except nvsmi.NvidiaSmiError as exc:
        return {"source": None, "no_driver": f"no NVIDIA driver: {nvml_failed}; {exc}"}


def placement(bus_id: str | None) -> dict:
    """The GPU's NUMA node and the CPUs near it, from sysfs (what `nvidia-smi topo -m` shows)."""
    if not bus_id:
        return {"numa_node": None, "cpu_affinity": None}
    # NVML writes 00000000:3B:00.0; sysfs names it 0000:3b:00.0.
    domain, _, rest = bus_id.partition(":")
    folder = f"/sys/bus/pci/devices/{domain[-4:]}:{rest}".lower()
    node = (read(f"{folder}/numa_node") or "").strip()
    cpus = (read(f"{folder}/local_cpulist") or "").strip()
    return {"numa_node": int(node) if node.lstrip("-").isdigit() and int(node) >= 0 else None,
            "cpu_affinity": cpus or None}


def holder(process: dict) -> dict:
    """A process holding GPU memory: who it is, as stale-processes describes one, and whether it
    looks like training. A PID without /proc here lives in another PID namespace (a container)."""
    pid = process["pid"]
    if not os.path.exists(f"/proc/{pid}"):
        return {**process, "visible_here": False}
    about = describe(pid)
    try:
        user = pwd.getpwuid(about["uid"]).pw_name if about["uid"] is not None else None
    except KeyError:
        user = str(about["uid"])
    return {**process, **about, "user": user, "visible_here": True,
            "why": training_reasons(pid, about["cmdline"])}


def infiniband(root: str = "/sys/class/infiniband") -> list[dict]:
    """The HCAs NCCL_IB_HCA can name, each port's state and link layer (RoCE is Ethernet)."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    found = []
    for name in names:
        ports = []
        try:
            numbers = sorted(os.listdir(f"{root}/{name}/ports"), key=lambda p: int(p) if p.isdigit() else 0)
        except OSError:
            numbers = []
        for port in numbers:
            state = (read(f"{root}/{name}/ports/{port}/state") or "").strip()     # "4: ACTIVE"
            layer = (read(f"{root}/{name}/ports/{port}/link_layer") or "").strip()
            ports.append({"port": int(port) if port.isdigit() else port,
                          "state": state.partition(":")[2].strip() or state or None, "link_layer": layer or None})
        found.append({"name": name, "ports": ports})
    return found


def nccl_conf() -> dict:
    """NCCL_* settings from the files NCCL reads at start: the environment wins over them, and the
    user's file (NCCL_CONF_FILE, else ~/.nccl.conf) over /etc/nccl.conf. ~ is this user's home
    from the password database, never HOME (sudo may keep another user's). Each is read bounded
    (node/bounded.py): a regular file of at most NCCL_CONF_BYTES, never a FIFO (which would hold
    the collector until its lease ends) or a device (a link to /dev/zero); those are named in
    "skipped" with why."""
    files = [os.environ.get("NCCL_CONF_FILE") or _own_home_file(".nccl.conf"), *NCCL_CONF_FILES]
    values: dict = {}
    read_from, skipped = [], {}
    for path in (p for p in files if p):
        try:
            text = read_regular(path, NCCL_CONF_BYTES).decode("utf-8", "replace")
        except Skipped as exc:
            skipped[path] = str(exc)
            continue
        except OSError:
            continue        # not there (the usual case), or unreadable: NCCL skips it too
        read_from.append(path)
        for line in text.splitlines():
            key, equals, value = line.strip().partition("=")
            if equals and key.strip().startswith("NCCL_") and not key.startswith("#"):
                values.setdefault(key.strip(), value.strip())
    return {"files": read_from, "values": values, "skipped": skipped}


def _own_home_file(name: str) -> str | None:
    try:
        return os.path.join(pwd.getpwuid(os.geteuid()).pw_dir, name)
    except KeyError:
        return None
