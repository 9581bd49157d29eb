"""Small pieces the checks share."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ddp_preflight.rules.facts import Missing, NodeFacts, Process

from ..model import Context, Status, Verdict

T = TypeVar("T")


def gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB"


def python_of(node: NodeFacts) -> str:
    python = node.parsed.python
    return (None if isinstance(python, Missing) else python.executable) or "python3"


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


def probed(ctx: Context, probe: str, seen: Callable[[Mapping[str, Any]], T]) -> tuple[T | None, Verdict | None]:
    """What a probe saw, as typed data (`seen`: its from_json), or the verdict to give instead:
    not probed, skipped, or failed. The one way a check reads a probe."""
    data = ctx.probes.get(probe)
    if data is None:
        return None, Verdict(Status.SKIP, None, "not probed (--no-probes)")
    if "error" in data:
        return None, Verdict(Status.ERROR, None, f"the {probe} probe failed: {data['error']}")
    if "skipped" in data:
        return None, Verdict(Status.SKIP, None, f"not probed: {data['skipped']}")
    return seen(data), None
