"""The training command's imports as the node's training Python resolves them
(node/facts/imports.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .read import Sent, flag, objects, required, sent_of, strings, text, texts, whole


@dataclass(frozen=True)
class MissingImport:
    module: str                 # as the code names it: wandb, nanochat.common
    file: str                   # the file that imports it, under the project's folder
    line: int

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> MissingImport:
        return cls(required(text(wire, "module"), "module"), required(text(wire, "file"), "file"),
                   whole(wire, "line") or 0)

    @property
    def top(self) -> str:
        return self.module.split(".")[0]


@dataclass(frozen=True)
class TrainingImports(Sent):
    """What the training command imports, resolved on the node from where the launch starts."""
    python: str
    entry: str | None = None                   # the script's path, or the module's name
    module: bool = False
    root: str | None = None                    # the project's folder: the start folder, or the script's
    entry_error: str | None = None             # the entry itself cannot be found there
    skipped: str | None = None                 # nothing to scan (--no-python)
    torch: bool = False
    files: tuple[str, ...] = ()                # the files read, entry first
    unreadable: tuple[str, ...] = ()
    missing: tuple[MissingImport, ...] = ()
    optional_missing: tuple[MissingImport, ...] = ()    # under try/except ImportError
    own: Mapping[str, str] = field(default_factory=dict)     # the project's own top-level modules -> file
    pythonpath: Mapping[str, str] = field(default_factory=dict)   # followed, found through PYTHONPATH -> file
    external: tuple[str, ...] = ()             # installed top-level modules it imports
    distributions: Mapping[str, str] = field(default_factory=dict)   # top-level module -> its pip name
    syntax_error: str | None = None            # "FILE:LINE: message": a file this Python cannot compile

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> TrainingImports:
        return cls(required(text(wire, "python"), "python"), text(wire, "entry"), flag(wire, "module"),
                   text(wire, "root"), text(wire, "entry_error"), text(wire, "skipped"), flag(wire, "torch"),
                   texts(wire, "files"), texts(wire, "unreadable"),
                   objects(wire, "missing", MissingImport.from_json),
                   objects(wire, "optional_missing", MissingImport.from_json),
                   strings(wire, "own"), strings(wire, "pythonpath"), texts(wire, "external"),
                   strings(wire, "distributions"), text(wire, "syntax_error"),
                   sent=sent_of(wire))
