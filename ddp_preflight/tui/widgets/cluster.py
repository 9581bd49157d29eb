"""The cluster at a glance: the run's backend, master and size, and each node. Names and
messages are shown, never obeyed (node/terminal.py)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from ddp_preflight.hangwatch.model import Snapshot
from ddp_preflight.node.terminal import shown_data

# A node's status said out loud only when it is not the normal one.
NODE_STYLE = {"connecting": "yellow", "lost": "bold red", "error": "bold red"}


class ClusterHeader(Static):
    DEFAULT_CSS = """
    ClusterHeader { height: auto; max-height: 3; padding: 0 1; background: $panel; }
    """

    _shown: Text | None = None

    def show(self, snapshot: Snapshot) -> None:
        text = render_cluster(snapshot)
        if text != self._shown:          # an update lays the screen out again: only on change
            self._shown = text
            self.update(text)


def render_cluster(snapshot: Snapshot) -> Text:
    run, nodes = shown_data(snapshot.run), shown_data(snapshot.nodes)
    text = Text()
    if run:
        text.append(run.get("backend") or "?", "bold")
        text.append(f" · master {run.get('master') or '?'} · {_count(len(snapshot.ranks), 'rank')} "
                    f"on {_count(len(nodes), 'node')}")
        text.append(" · launched" if run.get("launched") else " · attached")
    else:
        text.append("attached", "bold")
        text.append(f" · {_count(len(snapshot.ranks), 'rank')} on {_count(len(nodes), 'node')}")
    text.append(f" · stall {snapshot.threshold:g}s\n")
    # Nodes being watched as expected are grouped by interface and size, so eight of them fit
    # an 80-column line; a node in trouble gets its own entry with the reason.
    groups: dict[tuple[str, int], list[str]] = {}
    for node in nodes:
        if node.status == "watching":
            groups.setdefault((node.interface or "?", node.ranks), []).append(node.name)
    parts = []
    for (interface, ranks), names in groups.items():
        each = " each" if len(names) > 1 else ""
        parts.append((f"{', '.join(names)}: {interface}, {ranks} rank{'s' if ranks != 1 else ''}{each}", ""))
    for node in nodes:
        if node.status != "watching":
            reason = f" ({node.message})" if node.message else ""
            parts.append((f"{node.name}: {node.status.upper()}{reason}", NODE_STYLE.get(node.status, "bold")))
    for i, (part, style) in enumerate(parts):
        if i:
            text.append(" │ ", "dim")
        text.append(part, style)
    return text


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")
