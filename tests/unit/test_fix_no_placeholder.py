"""No fix a check gives holds a placeholder for the user to fill in (issue 38: `export
GLOO_SOCKET_IFNAME=<the interface that reaches the others>` on a dead route, `<its wired interface>`
on Wi-Fi): a fix names what it changes, or there is none. Two scans: every check over every
recorded lab run here (each with and without --launch and --params, and with each node's
interfaces unknown, where the placeholders came from), and every string a check module writes."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from ddp_preflight.preflight.checks import CHECKS, run_checks
from ddp_preflight.preflight.model import Context, NodeFacts, Options

ARTIFACTS = Path(__file__).parent / "artifacts"
CHECK_MODULES = Path(__file__).parents[2] / "ddp_preflight" / "preflight" / "checks"
# `<the LAN interface>`, `<its interface>`, `<PATH>`: words or a name in angle brackets.
PLACEHOLDER = re.compile(r"<(?:the|its|your|a|an|some|other)\b[^<>]*>|<[A-Z][A-Z_]+>")


def _recorded() -> list[str]:
    names = []
    for path in sorted(ARTIFACTS.glob("*.json")):
        text = path.read_text()
        if '"nodes"' in text and '"facts"' in text:
            art = json.loads(text)
            if isinstance(art, dict) and isinstance(art.get("nodes"), list) and art["nodes"] and \
                    all(isinstance(n, dict) and "facts" in n for n in art["nodes"]):
                names.append(path.stem)
    return names


def _without_interfaces(facts: dict | None) -> dict | None:
    if not isinstance(facts, dict) or not isinstance(facts.get("network"), dict):
        return facts
    return {**facts, "network": {**facts["network"], "interfaces": []}}


def _contexts(art: dict):
    nodes = tuple(NodeFacts(n["node"], n["facts"], n.get("error"), n.get("fix")) for n in art["nodes"])
    bare = tuple(NodeFacts(n.node, _without_interfaces(n.facts), n.error, n.fix) for n in nodes)
    probes = art.get("probes") or {}
    base = Options(master_addr=art.get("master_addr"))
    for facts in (nodes, bare):
        for options in (base, replace(base, launch=True), replace(base, params=126_000_000)):
            yield Context(facts, options, probes)


RECORDED = _recorded()


def test_the_recordings_are_found():
    assert {"lab_clean", "lab_faulted", "lab_dead_route", "lab_bandwidth_wifi", "lab_path_mtu_blackhole"} <= \
        set(RECORDED)


@pytest.mark.parametrize("name", RECORDED)
def test_no_fix_of_any_check_on_a_recorded_run_holds_a_placeholder(name):
    art = json.loads((ARTIFACTS / f"{name}.json").read_text())
    for ctx in _contexts(art):
        for result in run_checks(ctx, CHECKS):
            assert not PLACEHOLDER.search(result.fix or ""), (result.check, result.node, result.fix)


def test_no_check_module_writes_a_placeholder():
    found = []
    for path in sorted(CHECK_MODULES.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and PLACEHOLDER.search(node.value):
                found.append(f"{path.name}:{node.lineno}: {PLACEHOLDER.search(node.value).group(0)}")
    assert found == []
