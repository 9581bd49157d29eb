"""A node's data folder: every shard's name, size and digest (ddp_preflight/node/facts/shards.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .read import Unreadable, kind, required, strings, text, whole


@dataclass(frozen=True)
class ShardFile:
    size: int                    # in bytes
    digest: str | None           # by the manifest's algorithm


def _shard_files(wire: Mapping[str, Any]) -> Mapping[str, ShardFile]:
    files = kind(wire, "files", (Mapping,), "an object")
    if files is None:
        raise Unreadable("no files")
    out = {}
    for name, f in files.items():
        if not isinstance(f, Mapping):
            raise Unreadable(f"files[{name!r}] is not an object")
        out[name] = ShardFile(required(whole(f, "size"), f"files[{name!r}].size"), text(f, "digest"))
    return MappingProxyType(out)


@dataclass(frozen=True)
class ShardManifest:
    """The data folder on one node: every shard's name, size and digest."""
    algorithm: str                     # "xxh3_128", "blake3" or "blake2b"
    files: Mapping[str, ShardFile]     # by name inside the folder
    file_count: int
    total_bytes: int
    skipped: Mapping[str, str] = field(default_factory=dict)   # name -> why it is not in files
    # name -> how its digest was taken when not from every byte (a file over the node's cap is
    # hashed by its size and its two ends: node/facts/shards.py); the same rule on every node
    sampled: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> ShardManifest:
        return cls(required(text(wire, "algorithm"), "algorithm"), _shard_files(wire),
                   required(whole(wire, "file_count"), "file_count"),
                   required(whole(wire, "total_bytes"), "total_bytes"), strings(wire, "skipped"),
                   strings(wire, "sampled"))
