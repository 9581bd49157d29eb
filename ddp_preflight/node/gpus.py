"""The GPUs' activity, for hangwatch's agent: each GPU's utilization and memory activity every
sample, and which process has a context on which GPU, through NVML (ctypes on libnvidia-ml, as
node/facts/nvml.py reads it: nothing to install). A node without NVIDIA's driver has none.

A rank whose GPU runs one kernel that never ends shows it here: the GPU at 100 % utilization
with no memory activity, while the rank's host thread spins in cudaStreamSynchronize (recorded
on an H100: ../tests/unit/artifacts/gpu-h100/, hung-nvsmi.csv). Not run on a GPU in this
session: the calls are NVML's documented ones, as node/facts/nvml.py makes them."""

from __future__ import annotations

import ctypes
from typing import Dict, List, Optional

from .facts.nvml import Nvml, NvmlError, compute_processes

PROCESSES_EVERY = 5      # samples between two readings of which process is on which GPU


class Utilization(ctypes.Structure):     # nvmlUtilization_t
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class Gpus:
    def __init__(self) -> None:
        self.nvml: Optional[Nvml] = None
        self.handles: List[object] = []
        self.owner: Dict[int, int] = {}        # pid -> GPU index
        self.samples = 0
        try:
            self.nvml = Nvml()
            for index in range(self.nvml.number("nvmlDeviceGetCount_v2")):
                handle = ctypes.c_void_p()
                self.nvml.call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
                self.handles.append(handle)
        except (OSError, NvmlError, AttributeError):     # no driver here: no GPU to watch
            self.nvml, self.handles = None, []

    def sample(self) -> List[dict]:
        """[{"index", "util", "memory_util"}] for every GPU (a GPU NVML cannot read: None values)."""
        if self.nvml is None:
            return []
        if self.samples % PROCESSES_EVERY == 0:
            self._read_owners()
        self.samples += 1
        out = []
        for index, handle in enumerate(self.handles):
            rates = Utilization()
            try:                                          # nvmlDeviceGetUtilizationRates
                self.nvml.call("nvmlDeviceGetUtilizationRates", handle, ctypes.byref(rates))
                out.append({"index": index, "util": float(rates.gpu), "memory_util": float(rates.memory)})
            except NvmlError:
                out.append({"index": index, "util": None, "memory_util": None})  # type: ignore[dict-item]
        return out

    def of(self, pid: int) -> Optional[int]:
        return self.owner.get(pid)

    def _read_owners(self) -> None:
        owner = {}
        nvml = self.nvml
        if nvml is None:
            return
        for index, handle in enumerate(self.handles):
            try:
                for pid, _ in compute_processes(nvml, handle):
                    owner[pid] = index
            except NvmlError:
                continue
        self.owner = owner
