"""The layers, as docs/architecture.md draws them: each package imports only the ones below it.
Read from the source (every import, also those inside functions), so a new import that breaks a
layer fails here, whatever runs it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
OURS = ("node", "transport", "preflight", "hangwatch", "launch", "explain", "lab", "tui", "cli")

# package -> the packages of ours it may import (besides itself)
MAY = {
    "node": set(),
    "transport": {"node"},
    "preflight": {"node", "transport"},
    "hangwatch": {"node", "transport"},
    "lab": {"node"},
    "launch": {"node", "transport", "preflight", "hangwatch"},
    "explain": {"node", "preflight", "hangwatch"},      # reads what a run left: pure, over files
    # renders: never collects; node.terminal: every string shown, never obeyed (one sanitizer)
    "tui": {"hangwatch.model", "hangwatch.text", "hangwatch.stacks", "preflight.report", "node.terminal"},
    "cli": set(OURS),
}
# Entry points (`python -m preflight`, `python -m hangwatch`) hand over to cli/: nothing else.
ENTRY_POINTS = {"preflight/__main__.py", "hangwatch/__main__.py"}
# Only the transport knows how nodes are reached; the renderers never sample a process.
THIRD_PARTY_ONLY_IN = {"fabric": {"transport"}, "paramiko": {"transport"}, "psutil": set(),
                       "textual": {"tui"}}


def imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names]
    return names


def test_each_layer_imports_only_the_layers_below_it():
    broken = []
    for package, allowed in MAY.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in ENTRY_POINTS:
                continue
            for name in imports(path):
                top = name.split(".")[0]
                if top not in OURS or top == package:
                    continue
                if not any(name == a or name.startswith(a + ".") for a in allowed):
                    broken.append(f"{rel} imports {name}")
    assert not broken, "\n".join(broken)


def test_fabric_paramiko_psutil_and_textual_stay_where_they_belong():
    broken = []
    for package in OURS:
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in imports(path):
                top = name.split(".")[0]
                if top in THIRD_PARTY_ONLY_IN and package not in THIRD_PARTY_ONLY_IN[top]:
                    broken.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not broken, "\n".join(broken)


def test_the_tree_has_no_other_top_level_package():
    # A new layer gets its place in MAY (and in docs/architecture.md) before it gets code.
    found = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert found == set(OURS), found ^ set(OURS)


def test_python_version_of_the_node_package():
    # The node package runs on the nodes' own Python: 3.8 and newer. Its files parse as 3.8.
    for path in sorted((ROOT / "node").rglob("*.py")):
        ast.parse(path.read_text(), feature_version=(3, 8))
    assert sys.version_info >= (3, 8)
