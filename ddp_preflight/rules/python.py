"""Where the training's Python is, on one node: one answer for preflight (the facts, the probes,
training-imports), the launch (torchrun runs under it) and hangwatch attach (py-spy and the
agent find the ranks' interpreter with it)."""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class TrainingPython:
    path: str          # the interpreter, as the node will run it
    named: bool        # --python or the config named it; False: this interpreter's own path, a guess

    @property
    def given(self) -> str | None:
        """The path the user named, or None where it is a guess."""
        return self.path if self.named else None


def training_python(given: str | None, configured: str | None = None) -> TrainingPython:
    """--python (`given`, for every node) wins over the config's (`configured`: the node's own
    [nodes.NAME] python, else the config's python); else the interpreter running ddp-preflight,
    whose path the nodes often share (one virtualenv path on every machine)."""
    named = given or configured
    return TrainingPython(named, True) if named else TrainingPython(sys.executable, False)
