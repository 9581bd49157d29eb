"""The training environment's torch (ddp_preflight/node/facts/torchinfo.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .read import Sent, flag, objects, required, sent_of, text, texts, whole


@dataclass(frozen=True)
class CudaDevice:
    """A GPU as torch sees it (after CUDA_VISIBLE_DEVICES)."""
    index: int | None
    name: str | None
    memory_bytes: int | None = None

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> CudaDevice:
        return cls(whole(wire, "index"), text(wire, "name"), whole(wire, "memory_bytes"))


@dataclass(frozen=True)
class Wheel(Sent):
    name: str
    version: str | None

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> Wheel:
        return cls(required(text(wire, "name"), "name"), text(wire, "version"), sent=sent_of(wire))


@dataclass(frozen=True)
class TorchFacts:
    version: str                      # "2.13.0+cpu"
    build: str                        # "cpu", "cuda" or "rocm"
    git_version: str | None = None    # the commit it was built from; None: not said
    cuda: str | None = None           # the CUDA runtime it is built for; None: not a CUDA build
    backends: tuple[str, ...] = ()    # of gloo, nccl, mpi, ucc, xccl
    imported: bool = False            # torch itself answered (a GPU build); False: its version file did
    cuda_available: bool = False
    cuda_devices: tuple[CudaDevice, ...] = ()
    nccl_version: str | None = None   # "2.28.9"; None: not collected (a CPU build, or NCCL did not load)
    nccl_library: str | None = None   # the libnccl file torch mapped
    nccl_wheel: Wheel | None = None   # the pip wheel that ships it; None: none installed, or not said

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> TorchFacts:
        wheel = wire.get("nccl_wheel")
        return cls(required(text(wire, "version"), "version"), required(text(wire, "build"), "build"),
                   text(wire, "git_version"), text(wire, "cuda"), texts(wire, "backends"), flag(wire, "imported"),
                   flag(wire, "cuda_available"), objects(wire, "cuda_devices", CudaDevice.from_json),
                   text(wire, "nccl_version"), text(wire, "nccl_library"),
                   Wheel.from_json(wheel) if isinstance(wheel, Mapping) else None)
