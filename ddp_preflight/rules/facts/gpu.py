"""GPUs: whether one is there, and what NVIDIA's driver says about each (ddp_preflight/node/facts/gpu.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from .processes import Process
from .read import (
    Missing,
    Sent,
    Unreadable,
    flag,
    kind,
    number,
    objects,
    part,
    required,
    sent_of,
    strings,
    text,
    texts,
    whole,
)


@dataclass(frozen=True)
class GpuDevice(Sent):
    """A GPU as the driver (NVML or nvidia-smi) describes it. None: not readable, with the reason
    in `missing`."""
    index: int | None
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None              # "00000000:3B:00.0"
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    ecc_uncorrected_volatile: int | None = None   # since the driver loaded
    retired_pages_pending: bool | None = None     # before Ampere
    remapped_rows_pending: bool | None = None     # Ampere and newer
    remapped_rows_failed: bool | None = None
    clock_event_reasons: int | None = None     # NVML's bitmask
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    nvlinks_up: int | None = None
    numa_node: int | None = None
    error: str | None = None                   # the GPU does not answer
    mig: bool = False                          # a MIG instance CUDA_VISIBLE_DEVICES names
    missing: Mapping[str, str] = field(default_factory=dict)   # value -> why it is not there

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> GpuDevice:
        def yes(key: str) -> bool | None:
            return kind(wire, key, (bool,), "true or false")
        return cls(whole(wire, "index"), text(wire, "name"), text(wire, "uuid"), text(wire, "pci_bus_id"),
                   whole(wire, "memory_total_bytes"), whole(wire, "memory_used_bytes"),
                   whole(wire, "ecc_uncorrected_volatile"), yes("retired_pages_pending"), yes("remapped_rows_pending"),
                   yes("remapped_rows_failed"), whole(wire, "clock_event_reasons"), whole(wire, "pcie_gen"),
                   whole(wire, "pcie_gen_max"), whole(wire, "pcie_width"), whole(wire, "pcie_width_max"),
                   whole(wire, "nvlinks_up"), whole(wire, "numa_node"), text(wire, "error"), flag(wire, "mig"),
                   strings(wire, "missing"), sent=sent_of(wire))


@dataclass(frozen=True)
class GpuProcess(Process):
    """A process holding GPU memory. Seen in this node's /proc or not (another container)."""
    gpu: int | None = None             # the GPU's index; None: not known which
    used_bytes: int | None = None      # None: the driver does not say
    user: str | None = None
    visible_here: bool = False         # False: its PID is not in this node's /proc

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> GpuProcess:
        return cls(required(whole(wire, "pid"), "pid"), texts(wire, "cmdline"), number(wire, "age_seconds"),
                   flag(wire, "orphan"), texts(wire, "why"), whole(wire, "gpu"), whole(wire, "used_bytes"),
                   text(wire, "user"), flag(wire, "visible_here"), sent=sent_of(wire))


@dataclass(frozen=True)
class GpuLink(Sent):
    """How two GPUs connect: NVLink, or their path on the PCIe tree as `nvidia-smi topo -m` names it."""
    gpus: tuple[int, ...]
    path: str | None = None
    nvlink: bool | None = None

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> GpuLink:
        gpus = kind(wire, "gpus", (list, tuple), "a list") or ()
        return cls(tuple(gpus), text(wire, "path"), kind(wire, "nvlink", (bool,), "true or false"),
                   sent=sent_of(wire))


@dataclass(frozen=True)
class DriverView:
    """What NVIDIA's driver said, through NVML or nvidia-smi."""
    source: Literal["nvml", "nvidia-smi"]
    devices: tuple[GpuDevice, ...]
    processes: tuple[GpuProcess, ...]
    links: tuple[GpuLink, ...]
    driver_version: str | None = None
    cuda_driver_version: str | None = None     # the newest CUDA it runs

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> DriverView:
        source = wire.get("source")
        if source not in ("nvml", "nvidia-smi"):
            raise Unreadable(f"source {source!r} is not one this version knows")
        return cls(source, objects(wire, "devices", GpuDevice.from_json),
                   objects(wire, "processes", GpuProcess.from_json), objects(wire, "links", GpuLink.from_json),
                   text(wire, "driver_version"), text(wire, "cuda_driver_version"))


@dataclass(frozen=True)
class HcaPort:
    port: int | str
    state: str | None            # "ACTIVE", "DOWN" ...
    link_layer: str | None       # "InfiniBand" or "Ethernet" (RoCE)


@dataclass(frozen=True)
class Hca(Sent):
    """An InfiniBand (or RoCE) adapter NCCL_IB_HCA can name."""
    name: str
    ports: tuple[HcaPort, ...]

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> Hca:
        return cls(required(text(wire, "name"), "name"),
                   objects(wire, "ports", lambda p: HcaPort(p.get("port", "?"), text(p, "state"),
                                                             text(p, "link_layer"))),
                   sent=sent_of(wire))


@dataclass(frozen=True)
class NcclConf(Sent):
    """NCCL_* settings from the files NCCL reads at start (the environment wins over them)."""
    values: Mapping[str, str]

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> NcclConf:
        return cls(strings(wire, "values"), sent=sent_of(wire))


def _visible(wire: Mapping[str, Any]) -> Mapping[str, str | None]:
    values = kind(wire, "visible", (Mapping,), "an object") or {}
    if not all(v is None or isinstance(v, str) for v in values.values()):
        raise Unreadable("visible has values that are not text")
    return MappingProxyType(dict(values))


# What a gpu section from before node/facts/gpu.py's driver view lacks.
OLDER_COLLECTOR = Missing("not collected (a collector older than this check)")


def _driver_view(wire: Mapping[str, Any]) -> DriverView | Missing:
    if "source" not in wire:
        return OLDER_COLLECTOR
    if wire["source"] is None:
        return Missing(str(wire.get("no_driver") or "no NVIDIA driver answered"), failed=True)
    return DriverView.from_json(wire)


@dataclass(frozen=True)
class GpuFacts:
    nvidia_devices: tuple[str, ...]    # /dev/nvidiaN: a GPU is in the box, whatever the driver says
    amd_kfd: bool                      # /dev/kfd: an AMD GPU
    driver: DriverView | Missing       # Missing: no driver answered (failed), or not collected
    # CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER as the node's training
    # environment has them (None: unset); Missing: not collected (the env section has them too)
    visible: Mapping[str, str | None] | Missing
    infiniband: tuple[Hca, ...] | Missing
    nccl_conf: NcclConf | Missing

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> GpuFacts:
        return cls(texts(wire, "nvidia_devices"), flag(wire, "amd_kfd"), _driver_view(wire),
                   _visible(wire) if "visible" in wire else OLDER_COLLECTOR,
                   objects(wire, "infiniband", Hca.from_json) if wire.get("infiniband") is not None
                   else OLDER_COLLECTOR,
                   part(wire, "nccl_conf", NcclConf.from_json, absent=OLDER_COLLECTOR.reason))
