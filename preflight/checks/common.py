"""Small pieces the checks share."""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from ..facts import Missing, Process
from ..model import Context, NodeFacts, Status, Verdict
from ..training_env import ARG_ALL, CONFIG_ALL, CONFIG_NODE


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


def env_fix(ctx: Context, node: str, settings: list[tuple[str, str]]) -> str:
    """How to give the training on `node` these variables, where each is set now: the --env or
    the config table that gave it, else --env NODE:NAME=VALUE, which wins over the node's own
    environment for preflight and --launch alike (an `export` there never reaches a launched run)."""
    flags, config = [], []
    for name, value in settings:
        given = ctx.options.env.setting(node, name)
        word = shlex.quote(f"{name}={value}")
        if given is not None and given.layer in (CONFIG_ALL, CONFIG_NODE):
            table = "[env]" if given.layer == CONFIG_ALL else f"[nodes.{node}.env]"
            config.append(f'{name} = "{value}" under {table} in {ctx.options.env.config_path or "the config"}')
        elif given is not None and given.layer == ARG_ALL:
            flags.append(f"--env {word}")
        else:
            flags.append(f"--env {shlex.quote(node + ':' + name + '=' + value)}")
    return "; ".join(([" ".join(flags)] if flags else []) + config)


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
