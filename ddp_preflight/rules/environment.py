"""The training's environment on each node, and the fix that changes it in the form that reaches
the training as it will run: --env or the config under ddp-preflight (and --launch), an export
where the user starts torchrun by hand."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Protocol

from .facts import Missing, NodeFacts
from .fix import Action, Fix
from .training_env import ARG_ALL, ARG_NODE, CONFIG_ALL, CONFIG_NODE, TrainingEnv


class RunOptions(Protocol):
    @property
    def env(self) -> TrainingEnv: ...       # the training's variables given to ddp-preflight
    @property
    def launch(self) -> bool: ...           # ddp-preflight starts the training (--launch)


class Run(Protocol):
    """What a fix needs of the run (preflight's Context): its nodes and how the training starts."""
    @property
    def nodes(self) -> Sequence[NodeFacts]: ...
    @property
    def options(self) -> RunOptions: ...


def env_of(node: NodeFacts) -> Mapping[str, str]:
    """The node's variables that training reads; none when they were not collected."""
    env = node.parsed.env
    return {} if isinstance(env, Missing) else env


def env_fix(run: Run, node: str | None, settings: Sequence[tuple[str, str]], *,
            every_node: bool = False, note: str = "", where: bool = True) -> Fix:
    """The fix that gives the training these variables, in the form that reaches it as it will run.

    Given to preflight (--env, --env NODE:, the config's [env] or [nodes.NODE.env]) or under
    --launch: the flag or config line that sets it, which wins over the node's own environment
    for preflight and the launch alike (an `export` there never reaches a launched run). A value
    that every node gets (`every_node`; `node` None: the fix is for every node) is said once
    (--env NAME=VALUE, [env]), one that differs by node per node (--env NODE:NAME=VALUE,
    [nodes.NODE.env]); a setting given for one node is changed for that node. Otherwise the user
    starts torchrun on the node, where only an export reaches it: `export NAME=VALUE   # on NODE`.
    `note`: words that follow, as a comment; `where=False` leaves out the export's `# on NODE`
    (a fix quoted inside another's note)."""
    nodes = [node] if node is not None else [n.node for n in run.nodes]
    flags: list[str] = []
    config: list[str] = []
    exports: list[str] = []
    exported_on: list[str] = []
    for name in nodes:
        for var, value in settings:
            kind, text = _env_form(run, name, var, value, every_node or node is None)
            seen = {"flag": flags, "config": config, "export": exports}[kind]
            if text not in seen:
                seen.append(text)
            if kind == "export" and name not in exported_on:
                exported_on.append(name)
    steps = ([" ".join(flags)] if flags else []) + config
    comment = note
    if exports:
        on = "every node" if node is None and len(exported_on) == len(nodes) else ", ".join(exported_on)
        if where:
            comment = f"on {on}" + (f": {note}" if note else "")
        steps.append("export " + " ".join(exports))
    return Fix(Action.SET, tuple(steps), node, comment)


# A setting given for every node, changed for one node: the per-node layer of the same kind.
_FOR_ONE_NODE = {CONFIG_ALL: CONFIG_NODE, ARG_ALL: ARG_NODE}


def _env_form(run: Run, node: str, name: str, value: str, every_node: bool) -> tuple[str, str]:
    """One variable's fix on one node: ("flag" | "config" | "export", its words)."""
    given = run.options.env.setting(node, name)
    if given is None and not run.options.launch:
        return "export", _shell_word(f"{name}={value}", value)
    if given is None:
        layer = ARG_ALL if every_node else ARG_NODE
    else:
        layer = given.layer if every_node else _FOR_ONE_NODE.get(given.layer, given.layer)
    if layer == ARG_ALL:
        return "flag", "--env " + _shell_word(f"{name}={value}", value)
    if layer == ARG_NODE:
        return "flag", "--env " + _shell_word(f"{node}:{name}={value}", value)
    table = "[env]" if layer == CONFIG_ALL else f"[nodes.{node}.env]"
    return "config", f"{name} = {json.dumps(value)} under {table} in {run.options.env.config_path or 'the config'}"


def _shell_word(word: str, value: str) -> str:
    """`word` quoted for a shell, unless its value is a placeholder for the user to fill in
    (<its wired interface>), which no quoting makes pasteable."""
    return word if value.startswith("<") and value.endswith(">") else shlex.quote(word)
