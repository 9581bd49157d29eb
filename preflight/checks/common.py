"""Small pieces the checks share."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence

from ..facts import Missing, Process
from ..model import Context, NodeFacts, Status, Verdict
from ..training_env import ARG_ALL, ARG_NODE, CONFIG_ALL, CONFIG_NODE


def gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB"


def on_node(node: str, command: str) -> str:
    """A fix to run on another node, pasteable from the master."""
    return f"ssh {node} {shlex.quote(command)}"


def python_of(node: NodeFacts) -> str:
    python = node.parsed.python
    return (None if isinstance(python, Missing) else python.executable) or "python3"


def env_of(node: NodeFacts) -> Mapping[str, str]:
    """The node's variables that training reads; none when they were not collected."""
    env = node.parsed.env
    return {} if isinstance(env, Missing) else env


def env_fix(ctx: Context, node: str | None, settings: Sequence[tuple[str, str]], *,
            every_node: bool = False, note: str = "", where: bool = True) -> str:
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
    nodes = [node] if node is not None else [n.node for n in ctx.nodes]
    flags: list[str] = []
    config: list[str] = []
    exports: list[str] = []
    exported_on: list[str] = []
    for name in nodes:
        for var, value in settings:
            kind, text = _env_form(ctx, name, var, value, every_node or node is None)
            seen = {"flag": flags, "config": config, "export": exports}[kind]
            if text not in seen:
                seen.append(text)
            if kind == "export" and name not in exported_on:
                exported_on.append(name)
    parts = ([" ".join(flags)] if flags else []) + config
    comment = [note] if note else []
    if exports:
        on = "every node" if node is None and len(exported_on) == len(nodes) else ", ".join(exported_on)
        if where:
            comment = [f"on {on}" + (f": {note}" if note else "")]
        parts.append("export " + " ".join(exports))
    return "; ".join(parts) + ("   # " + comment[0] if comment else "")


# A setting given for every node, changed for one node: the per-node layer of the same kind.
_FOR_ONE_NODE = {CONFIG_ALL: CONFIG_NODE, ARG_ALL: ARG_NODE}


def _env_form(ctx: Context, node: str, name: str, value: str, every_node: bool) -> tuple[str, str]:
    """One variable's fix on one node: ("flag" | "config" | "export", its words)."""
    given = ctx.options.env.setting(node, name)
    if given is None and not ctx.options.launch:
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
    return "config", f"{name} = {json.dumps(value)} under {table} in {ctx.options.env.config_path or 'the config'}"


def _shell_word(word: str, value: str) -> str:
    """`word` quoted for a shell, unless its value is a placeholder for the user to fill in
    (<its wired interface>), which no quoting makes pasteable."""
    return word if value.startswith("<") and value.endswith(">") else shlex.quote(word)


def short_command(argv: list[str], limit: int = 90) -> str:
    """The command line with its program's folder left out, cut at a word."""
    if not argv:
        return "?"
    if len(argv) == 1 and " " in argv[0]:
        # A retitled process (sshd: "sshd: /usr/sbin/sshd -D [listener] ..."): one argument of words.
        argv = argv[0].split()
    words = [argv[0].rsplit("/", 1)[-1]] + [a if len(a) < 60 else "…" + a[-40:] for a in argv[1:]]
    text = ""
    for word in words:
        if len(text) + len(word) + 1 > limit:
            return text + " …"
        text = f"{text} {word}" if text else word
    return text


def describe_process(proc: Process, *, orphan: bool = True) -> str:
    """PID, command, orphan (unless told not to say it) and age, in one parenthesis."""
    command = short_command(list(proc.cmdline))
    age = proc.age_seconds
    when = "" if age is None else (f", {age / 3600:.1f} h old" if age >= 3600 else f", {age:.0f} s old")
    orphaned = ", orphan" if orphan and proc.orphan else ""
    return f"PID {proc.pid} ({command}{orphaned}{when})"


def probe_data(ctx: Context, probe: str) -> tuple[dict, Verdict | None]:
    """A probe's data, or the verdict to give instead (with empty data): not probed, skipped,
    or failed."""
    data = ctx.probes.get(probe)
    if data is None:
        return {}, Verdict(Status.SKIP, None, "not probed (--no-probes)")
    if "error" in data:
        return {}, Verdict(Status.ERROR, None, f"the {probe} probe failed: {data['error']}")
    if "skipped" in data:
        return {}, Verdict(Status.SKIP, None, f"not probed: {data['skipped']}")
    return data, None
