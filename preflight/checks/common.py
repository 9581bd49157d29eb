"""Small pieces the checks share."""

from __future__ import annotations

import shlex

from ..model import Context, NodeFacts, Result, Status


def gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB"


def on_node(node: str, command: str) -> str:
    """A fix to run on another node, pasteable from the master."""
    return f"ssh {node} {shlex.quote(command)}"


def python_of(node: NodeFacts) -> str:
    python = node.section("python") or {}
    return python.get("executable") or "python3"


def env_of(node: NodeFacts) -> dict:
    return (node.section("env") or {}).get("vars", {})


def network_of(node: NodeFacts) -> dict:
    return node.section("network") or {}


def interface(node: NodeFacts, name: str | None) -> dict | None:
    for iface in network_of(node).get("interfaces", []):
        if iface["name"] == name:
            return iface
    return None


def interface_with_address(node: NodeFacts, address: str | None) -> dict | None:
    for iface in network_of(node).get("interfaces", []):
        if any(a["address"] == address for a in iface["addresses"]):
            return iface
    return None


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


def describe_process(proc: dict) -> str:
    command = short_command(proc.get("cmdline") or [])
    age = proc.get("age_seconds")
    when = "" if age is None else (f", {age / 3600:.1f} h old" if age >= 3600 else f", {age:.0f} s old")
    orphan = ", orphan" if proc.get("orphan") else ""
    return f"PID {proc['pid']} ({command}{orphan}{when})"


def probe_data(ctx: Context, probe: str, check: str) -> tuple[dict | None, Result | None]:
    """A probe's data, or the result to give instead: not probed, skipped, or failed."""
    data = ctx.probes.get(probe)
    if data is None:
        return None, Result(check, Status.SKIP, None, "not probed (--no-probes)")
    if "error" in data:
        return None, Result(check, Status.ERROR, None, f"the {probe} probe failed: {data['error']}")
    if "skipped" in data:
        return None, Result(check, Status.SKIP, None, f"not probed: {data['skipped']}")
    return data, None
