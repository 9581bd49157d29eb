"""The training code's revision (ddp_preflight/node/facts/code.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .read import Sent, flag, required, sent_of, strings, text, whole


@dataclass(frozen=True)
class CodeFacts(Sent):
    """The training code's revision: a git commit and uncommitted changes, or a hash of the files."""
    dir: str
    git: bool
    commit: str | None = None          # None: not a git folder, or HEAD did not resolve
    dirty: bool = False
    changed_count: int = 0
    changes_hash: str | None = None    # of the uncommitted changes; None: none
    tree_hash: str | None = None       # without git: of the source files
    skipped: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # name -> why not read (a FIFO)

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> CodeFacts:
        return cls(required(text(wire, "dir"), "dir"), flag(wire, "git"), text(wire, "commit"),
                   flag(wire, "dirty"), whole(wire, "changed_count") or 0, text(wire, "changes_hash"),
                   text(wire, "tree_hash"), strings(wire, "skipped"), sent=sent_of(wire))
