"""The layers, as docs/architecture.md draws them: each package imports only the ones below it.
Read from the source (every import, also those inside functions), so a new import that breaks a
layer fails here, whatever runs it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2] / "ddp_preflight"     # the import package: one folder per layer
OURS = ("node", "transport", "rules", "preflight", "hangwatch", "launch", "explain", "lab", "tui", "cli")

# package -> the packages of ours it may import (besides itself)
MAY = {
    "node": set(),
    "transport": {"node"},
    # The rules several layers share (routes, the environment model, fixes, a node's facts):
    # below preflight, hangwatch, explain and launch, so none of them imports another for them.
    "rules": {"node", "transport"},
    "preflight": {"node", "transport", "rules"},
    "hangwatch": {"node", "transport", "rules"},
    "lab": {"node"},
    "launch": {"node", "transport", "rules", "preflight", "hangwatch"},
    "explain": {"node", "rules", "preflight", "hangwatch"},      # reads what a run left: pure, over files
    # renders: never collects; node.terminal: every string shown, never obeyed (one sanitizer)
    "tui": {"hangwatch.model", "hangwatch.source", "hangwatch.text", "hangwatch.ended_text", "hangwatch.words",
            "hangwatch.stacks", "preflight.report", "node.terminal"},
    "cli": set(OURS),
}
# Entry points (`python -m ddp_preflight`, `python -m ddp_preflight.hangwatch`) hand over to cli/: nothing else.
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
    return [n.removeprefix("ddp_preflight.") for n in names]


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


def test_rules_import_the_standard_library_node_and_transport_only():
    # The room below the layers: pure, so preflight, hangwatch, explain and launch can all use it.
    broken = []
    for path in sorted((ROOT / "rules").rglob("*.py")):
        for name in imports(path):
            top = name.split(".")[0]
            if top not in ("node", "transport", "rules", "__future__") and top not in sys.stdlib_module_names:
                broken.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not broken, "\n".join(broken)


def test_explain_and_launch_take_shared_rules_from_rules_not_from_the_checks():
    # preflight's checks judge a run before it starts; what explain and launch share with them
    # (routes, the environment, who holds a port, workarounds, fixes) lives in rules/.
    broken = [f"{path.relative_to(ROOT)} imports {name}"
              for package in ("explain", "launch") for path in sorted((ROOT / package).rglob("*.py"))
              for name in imports(path) if name == "preflight.checks" or name.startswith("preflight.checks.")]
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
    found = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert found == set(OURS), found ^ set(OURS)


def test_python_version_of_the_node_package():
    # The node package runs on the nodes' own Python: 3.8 and newer. Its files parse as 3.8.
    for path in sorted((ROOT / "node").rglob("*.py")):
        ast.parse(path.read_text(), feature_version=(3, 8))
    assert sys.version_info >= (3, 8)


# -- hangwatch: decisions apart from their words (issue 24) -----------------------------------------

# The modules that decide (or hold what is decided): none may reach a renderer, directly or through
# another module of hangwatch, so no decision can carry, or read back, its own words.
DECISIONS = ("diagnose", "verdicts", "exits", "ended", "progress", "classify", "sequence", "stacks", "agents",
             "state", "reducer", "stalled", "waiting", "rendezvous", "evidence", "causes", "runs", "stall",
             "inputs", "events", "model", "who", "tracebacks", "lost_peer", "prefixes", "torchrun_table", "failures",
             "named", "notes")
RENDERERS = ("hangwatch.text", "hangwatch.ended_text", "hangwatch.words", "hangwatch.render", "node.terminal")
# Where a verdict's words may be rendered: the renderers, and the edges that show them (the CLI, the
# dashboard, the bundle and the watcher's shell, the launch summary, explain's renderer).
EDGES = ("hangwatch/text.py", "hangwatch/ended_text.py", "hangwatch/render.py", "hangwatch/incident.py",
         "hangwatch/watch.py", "launch/outcome.py", "explain/render.py", "tui/", "cli/")


def resolved_imports(path: Path) -> list[str]:
    """Every module a file imports, relative imports resolved against its package ("from . import
    text" in hangwatch/x.py is hangwatch.text)."""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            names.append(module)
            names += [f"{module}.{a.name}" for a in node.names]
    return [n.removeprefix("ddp_preflight.") for n in names]


def test_no_decision_module_of_hangwatch_reaches_a_renderer():
    graph = {path.stem: [n for n in resolved_imports(path)] for path in (ROOT / "hangwatch").glob("*.py")}
    broken = []
    for start in DECISIONS:
        assert start in graph, start           # a module renamed: the list follows it
        seen, todo = {start}, [start]
        while todo:
            here = todo.pop()
            for name in graph[here]:
                if any(name == r or name.startswith(r + ".") for r in RENDERERS):
                    broken.append(f"hangwatch/{start}.py reaches {name} (through hangwatch/{here}.py)")
                parts = name.split(".")
                inner = parts[1] if parts[0] == "hangwatch" and len(parts) > 1 else None
                if inner in graph and inner not in seen:
                    seen.add(inner)
                    todo.append(inner)
    assert not broken, "\n".join(sorted(set(broken)))


def test_a_verdict_carries_no_words_and_only_the_edges_render_them():
    from ddp_preflight.hangwatch.model import Diagnosis, Evidence
    # No rendered text on a verdict: its words come from its fields, at the edge (text.summary).
    assert "summary" not in Diagnosis.__dataclass_fields__
    assert "summary" not in Evidence.__dataclass_fields__
    broken = []
    for package in OURS:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            tree = ast.parse(path.read_text())
            # Nothing builds a verdict with words in it (Diagnosis(summary=...), replace(d, summary=...)).
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and any(k.arg == "summary" for k in node.keywords):
                    func = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                    if func in ("Diagnosis", "replace", "verdict"):
                        broken.append(f"{rel}:{node.lineno} gives a verdict words ({func}(summary=...))")
            # Only the edges render a verdict's sentence (text.py, ended_text.py: summary, headline, ...).
            if not rel.startswith(EDGES):
                for name in resolved_imports(path):
                    if name.startswith(("hangwatch.text", "hangwatch.ended_text")):
                        broken.append(f"{rel} imports {name}")
    assert not broken, "\n".join(sorted(set(broken)))


def test_the_dashboard_paints_a_hang_by_the_one_rule_the_watcher_uses():
    from ddp_preflight.hangwatch.model import HANGS, Diagnosis, Kind, is_hang
    from ddp_preflight.tui.widgets.diagnosis import HANG, MILD, colour
    assert colour(None) is None
    for kind in Kind:
        assert colour(Diagnosis(kind)) == (HANG if kind in HANGS else MILD), kind
        assert is_hang(kind) is kind.is_hang is (kind in HANGS), kind
    assert colour(Diagnosis(Kind.SLOW)) == MILD          # a slow collective is no hang: never red
    # The widget keeps no set of kinds of its own: model's rule is its only one.
    source = (ROOT / "tui" / "widgets" / "diagnosis.py").read_text()
    assert not [word for kind in Kind for word in (f'"{kind.value}"', f"'{kind.value}'") if word in source]


def test_hangwatchs_modules_import_one_another_without_a_cycle():
    # ended.py once imported verdicts.py inside a function to read the live ranks, and verdicts.py
    # ended.py: a cycle; each rank's evidence now has a module of its own (evidence.py).
    modules = {path.stem for path in (ROOT / "hangwatch").glob("*.py")}
    graph = {path.stem: {n.split(".")[1] for n in resolved_imports(path) if n.startswith("hangwatch.")
                         and n.split(".")[1] in modules} - {path.stem}
             for path in (ROOT / "hangwatch").glob("*.py")}
    cycles = []

    def visit(path: list[str]) -> None:
        for name in sorted(graph[path[-1]]):
            if name == path[0]:
                cycles.append(" -> ".join(path + [name]))
            elif name not in path and name > path[0]:      # each cycle found once, from its least module
                visit(path + [name])

    for start in sorted(graph):
        visit([start])
    assert not cycles, "\n".join(cycles)



# -- One catalogue of what a message means (issue 24) -----------------------------------------------

# Where the words of torch, NCCL, Gloo, the launchers and the kernel may be matched: rules/ only
# (failures.py: the catalogue and the messages read in their own form; message_parts.py: their fields).
MATCHING = ("hangwatch", "explain", "launch", "preflight", "cli", "tui")
# A literal is matched against text when it is a pattern (re.compile(...), re.search(...)), a
# string method's argument (line.startswith(...)), a side of `in`, or what a comprehension runs over
# (any(w in line for w in (...))); a module-level name in one of those places stands for its value
# (a string, or a tuple, list or set of them).
MATCH_CALLS = {"compile", "search", "match", "fullmatch", "findall", "finditer", "sub", "subn", "split",
               "startswith", "endswith", "find", "rfind", "index", "count", "removeprefix", "removesuffix"}


def matched_literals(tree: ast.Module) -> list[ast.Constant]:
    """The string literals a module matches text with, as MATCH_CALLS and the comment above say."""
    module_values = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
                     and isinstance(node.value, (ast.Constant, ast.Tuple, ast.List, ast.Set))
                     for t in node.targets if isinstance(t, ast.Name)}
    places: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in MATCH_CALLS:
                places += node.args
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            places += [node.left, *node.comparators]
        elif isinstance(node, ast.comprehension):
            places.append(node.iter)
    found = []
    for place in places:
        for node in ast.walk(place):
            if isinstance(node, ast.Name) and node.id in module_values:
                found += [n for n in ast.walk(module_values[node.id]) if isinstance(n, ast.Constant)]
            elif isinstance(node, ast.Constant):
                found.append(node)
    return [n for n in found if isinstance(n.value, str)]


def failure_text_matched_outside_the_catalogue(paths, root: Path = ROOT) -> list[str]:
    from ddp_preflight.rules.failures import WORDS
    broken = []
    for path in paths:
        rel = path.relative_to(root).as_posix()
        for literal in matched_literals(ast.parse(path.read_text())):
            words = [w for w in WORDS if w in literal.value]
            if words:
                broken.append(f"{rel}:{literal.lineno} matches {literal.value[:60]!r} ({', '.join(words)})")
    return sorted(set(broken))


def test_no_module_outside_the_catalogue_matches_failure_text():
    # rules/failures.py is the one catalogue of what torch, NCCL, Gloo, the launchers and the kernel
    # say: hangwatch, explain, launch, preflight and the edges take its patterns and words by name.
    paths = [p for package in MATCHING for p in sorted((ROOT / package).rglob("*.py"))]
    broken = failure_text_matched_outside_the_catalogue(paths)
    assert not broken, "\n".join(broken)


def test_the_catalogue_check_sees_a_pattern_of_its_own(tmp_path):
    # The check above catches the old ways: a module's own regex, a substring test, a tuple of words.
    from ddp_preflight.rules.failures import CATALOGUE, WORDS
    assert {w for m in CATALOGUE for w in m.words} <= set(WORDS)
    (tmp_path / "old.py").write_text(
        "import re\n"
        "IN_USE = re.compile(r'EADDRINUSE|[Aa]ddress already in use')\n"
        "PHRASES = ('Connection closed by peer',)\n"
        "def f(line):\n"
        "    return 'ss_family' in line or any(p in line for p in PHRASES) or line.endswith('ChildFailedError:')\n")
    found = failure_text_matched_outside_the_catalogue([tmp_path / "old.py"], tmp_path)
    assert [f.split(" matches")[0] for f in found] == ["old.py:2", "old.py:3", "old.py:5", "old.py:5"], found
