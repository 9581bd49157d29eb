"""A fix as data: what to run, set or change, on which node. Checks (and explain, and the launch
summary) build it where they find the cause; the JSON report's `fix` stays a string, the text
rendered from these fields at the edge (`Fix.text`), so the contract does not change while the
code reads fields, never a sentence."""

from __future__ import annotations

import enum
import shlex
from dataclasses import dataclass


class Action(str, enum.Enum):
    RUN = "run"          # commands to paste into a shell, on `node` (the master's shell: `ssh NODE ...`)
    SET = "set"          # variables the training gets: --env, a config line, or an export
    CHANGE = "change"    # something to change by hand, said in words: code, a folder, a package, an option


@dataclass(frozen=True)
class Fix:
    """One fix: its steps in order (each one pasteable, or readable, alone), the node it is for,
    and a note said after them as a shell comment (where it runs, why, or what else does)."""
    action: Action
    steps: tuple[str, ...]
    node: str | None = None       # the node it is for; None: the master, or every node alike
    note: str = ""

    def text(self) -> str:
        """As the report shows it: the steps joined by '; ', the note after '   # '."""
        return "; ".join(self.steps) + (f"   # {self.note}" if self.note else "")

    def with_note(self, note: str) -> Fix:
        return Fix(self.action, self.steps, self.node, note)


def run(command: str, node: str | None = None, note: str = "") -> Fix:
    """A command to run (on `node`, which the note says where it matters)."""
    return Fix(Action.RUN, (command,), node, note)


def change(words: str, node: str | None = None, note: str = "") -> Fix:
    """A change to make by hand, in words."""
    return Fix(Action.CHANGE, (words,), node, note)


def on_node(node: str, command: str) -> Fix:
    """A command to run on another node, pasteable from the master."""
    return Fix(Action.RUN, (f"ssh {node} {shlex.quote(command)}",), node)


def text_of(fix: Fix | None) -> str | None:
    """The report's `fix`: the fix's text, or None."""
    return None if fix is None else fix.text()


def said(words: str | None, node: str | None = None) -> Fix | None:
    """A fix that came as words from another layer (a transport's error: "pass --python PATH"),
    kept as said."""
    return None if not words else change(words, node)
