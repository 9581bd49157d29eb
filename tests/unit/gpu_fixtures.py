"""The recorded H100 host (artifacts/gpu-h100, see its README) as the checks receive it, and
variants of it. Everything not read from a recording is marked DERIVED and says what it stands for."""

from __future__ import annotations

import copy
import functools
import json
import re
from pathlib import Path

from ddp_preflight.node.facts import nvsmi
from ddp_preflight.preflight.model import Context, NodeFacts, Options

H100 = Path(__file__).parent / "artifacts" / "gpu-h100"
MIB = 2**20


@functools.cache
def recording(name: str) -> str:
    return (H100 / name).read_text()


def recorded_facts() -> dict:
    """The facts the collectors printed on the H100 host (before ddp_preflight/node/facts/gpu.py existed)."""
    return json.loads(recording("facts-h100.txt").split(" ", 1)[1])


def recorded_apps() -> str:
    """The --query-compute-apps table of healthy-nvsmi.csv (the file's second table)."""
    text = recording("healthy-nvsmi.csv")
    return text[text.index("pid,"):]


def _from_q(label: str, section: str) -> str:
    """A value of `nvidia-smi -q`: the first `label : value` line after `section`."""
    text = recording("nvidia-smi-q.txt")
    return re.search(rf"{label}\s*:\s*(.+)", text[text.index(section):]).group(1).strip()


def driver_view() -> dict:
    """DERIVED (see the README): the gpu section's driver view on the H100 host, from its recorded
    nvidia-smi outputs run through node/facts/nvsmi.py's parsers."""
    devices, driver = nvsmi.devices(recording("nvidia-smi-query.csv"))
    [gpu] = devices
    link = "GPU Link Info"
    gpu.update(pcie_gen=int(_from_q("Current", link)), pcie_gen_max=int(_from_q("Max", link)),
               pcie_width=int(_from_q("Current", "Link Width").rstrip("x")),
               pcie_width_max=int(_from_q("Max", "Link Width").rstrip("x")),
               retired_pages_pending=None)
    for key in ("pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max"):
        gpu["missing"].pop(key)
    gpu["missing"]["retired_pages_pending"] = f"nvidia-smi: {_from_q('Pending Page Blacklist', 'Retired Pages')}"
    # nvidia-smi-topo.txt: "GPU0  X  0-15  0  N/A": CPU affinity 0-15, NUMA node 0.
    row = next(line for line in recording("nvidia-smi-topo.txt").splitlines() if line.startswith("GPU0"))
    cells = [c.strip() for c in row.split("\t") if c.strip()]
    gpu.update(cpu_affinity=cells[2], numa_node=int(cells[3]))
    return {"source": "nvidia-smi",
            "nvml_failed": "DERIVED: NVML loaded on that host; this view is the nvidia-smi fallback's",
            "driver_version": driver,
            "cuda_driver_version": nvsmi.cuda_driver_version(recording("nvidia-smi-q.txt")),
            "devices": devices, "processes": [], "links": nvsmi.topology_links(recording("nvidia-smi-topo.txt")),
            "missing": {}, "visible": {"CUDA_VISIBLE_DEVICES": None, "NVIDIA_VISIBLE_DEVICES": None,
                                       "CUDA_DEVICE_ORDER": None},
            "nccl_conf": {"files": [], "values": {}}}


def h100(with_driver_view: bool = True) -> dict:
    """The recorded facts; with the derived driver view and the recorded NCCL version unless asked not."""
    facts = recorded_facts()
    if with_driver_view:
        facts["gpu"].update(driver_view())
        # DERIVED: torch-cuda.txt recorded `torch.cuda.nccl.version()` = (2, 28, 9) on that host.
        facts["torch"]["nccl_version"] = "2.28.9"
    return facts


def context(*nodes: tuple[str, dict], **options) -> Context:
    """Nodes as (name, facts), the first the master; a CUDA run over NCCL unless told otherwise."""
    options = {"backend": "nccl", "device": "cuda", **options}
    return Context(tuple(NodeFacts(name, facts) for name, facts in nodes), Options(**options))


def edited(facts: dict, edit) -> dict:
    facts = copy.deepcopy(facts)
    edit(facts)
    return facts


def device(facts: dict, index: int = 0) -> dict:
    return next(d for d in facts["gpu"]["devices"] if d["index"] == index)


def second_gpu(facts: dict, nvlinks: tuple[int | None, int | None] = (None, None)) -> dict:
    """DERIVED: the host with a second H100 (index 1, its own UUID and bus id), both seen by torch;
    `nvlinks` gives each GPU's links up (None: no NVLink facts, as the recorded fallback had)."""
    def edit(f):
        first = device(f, 0)
        other = copy.deepcopy(first)
        other.update(index=1, uuid="GPU-00000000-0000-0000-0000-000000000001", pci_bus_id="00000000:00:07.0")
        f["gpu"]["devices"].append(other)
        for gpu, up in zip((first, other), nvlinks, strict=True):
            if up is not None:
                gpu.update(nvlinks_up=up, nvlinks_down=18 - up)
                gpu["missing"].pop("nvlinks_up", None)
                gpu["missing"].pop("nvlinks_down", None)
        f["gpu"]["nvidia_devices"] = ["nvidia0", "nvidia1"]
        f["torch"]["cuda_devices"].append({**f["torch"]["cuda_devices"][0], "index": 1})
    return edited(facts, edit)


def cuda_visible(facts: dict, value: str, torch_sees: int) -> dict:
    """DERIVED: CUDA_VISIBLE_DEVICES=value in the node's environment, and torch seeing that many."""
    def edit(f):
        f["gpu"]["visible"]["CUDA_VISIBLE_DEVICES"] = value
        f["env"]["vars"]["CUDA_VISIBLE_DEVICES"] = value
        f["torch"]["cuda_devices"] = f["torch"]["cuda_devices"][:torch_sees]
    return edited(facts, edit)


# The holder of the recorded healthy run: pid 444 with 1836 MiB (healthy-nvsmi.csv). Its command
# line and parentage were not recorded: DERIVED as the recorded script run by torchrun, still
# there after its torchrun died (an orphan, as seed 002's leftovers were).
LEFTOVER = {"gpu": 0, "pid": 444, "used_bytes": 1836 * MIB, "ppid": 1, "uid": 0, "user": "root",
            "cmdline": ["/opt/torch/.venv/bin/python", "-u", "train_gpu_hang.py"], "age_seconds": 5400.0,
            "orphan": True, "visible_here": True, "why": ["RANK in its environment", "a training script"]}


def holding(facts: dict, *processes: dict, used_mib: int = 1845) -> dict:
    """The GPU's memory held by these processes; memory.used as recorded during that run (1845 MiB)."""
    def edit(f):
        f["gpu"]["processes"] = [dict(p) for p in processes]
        device(f)["memory_used_bytes"] = used_mib * MIB
    return edited(facts, edit)
