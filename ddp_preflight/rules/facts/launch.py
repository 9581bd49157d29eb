"""How the master's torchrun parses the training command (ddp_preflight/node/facts/launch.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .read import Sent, flag, present, sent_of, text, texts


@dataclass(frozen=True)
class LaunchParse(Sent):
    """How the master's own torchrun parses the training command."""
    parsed: bool
    message: str | None = None                 # its error, when it rejects the command
    training_script: str | None = None
    training_script_args: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> LaunchParse:
        present(wire, "parsed")
        return cls(flag(wire, "parsed"), text(wire, "message"), text(wire, "training_script"),
                   texts(wire, "training_script_args"), sent=sent_of(wire))
