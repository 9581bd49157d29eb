"""A fix is one command that does what it says when pasted, said once (issue 26): torch-parity's
pip line carries PyTorch's index for the build the node needs (read from its facts), and the text
report prints one cause's fix once, with the checks that saw it, however many checks offer it.
On the recorded lab facts and probe runs."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from ddp_preflight.preflight.checks import BY_ID, CHECKS, run_checks
from ddp_preflight.preflight.model import Context, NodeFacts, Options, Report, Status
from ddp_preflight.preflight.report import text

from . import facts_fixtures as ff
from .facts_fixtures import clean, context, faulted, one

PYTHON = "/work/main/.venv/bin/python"      # the training Python both lab nodes reported
WHEELS = "https://download.pytorch.org/whl"
COLLECTIVES = Path(__file__).parent / "artifacts" / "collectives_gloo_2node.json"


def torch_of(art: dict, node: str, version: str | None, build: str = "cpu", cuda: str | None = None) -> dict:
    """`node`'s torch as its facts would say it: None for no torch in its Python."""
    art = copy.deepcopy(art)
    if version is None:
        ff.facts(art, node).pop("torch")
        return art
    ff.facts(art, node)["torch"].update(version=version, build=build, cuda=cuda, git_version="0" * 40)
    return art


@pytest.mark.parametrize("master, worker, command", [
    # Both CPU builds: the master's wheel, from PyTorch's CPU index (PyPI's would be CUDA's).
    (("2.13.0+cpu",), ("2.9.1+cpu",), f"torch==2.13.0 --index-url {WHEELS}/cpu"),
    # Both CUDA builds: the master's exact wheel, from its CUDA index.
    (("2.13.0+cu128", "cuda", "12.8"), ("2.9.1+cu126", "cuda", "12.6"), f"torch==2.13.0 --index-url {WHEELS}/cu128"),
    # A CPU node beside a CUDA master keeps the CPU build it has.
    (("2.13.0+cu128", "cuda", "12.8"), ("2.9.1+cpu",), f"torch==2.13.0 --index-url {WHEELS}/cpu"),
    # A ROCm node beside a CPU master: its own ROCm index.
    (("2.13.0+cpu",), ("2.9.1+rocm6.3", "rocm"), f"torch==2.13.0 --index-url {WHEELS}/rocm6.3"),
    # No torch on the node: the master's build.
    (("2.13.0+cpu",), (None,), f"torch==2.13.0 --index-url {WHEELS}/cpu"),
    # A release from PyPI (no build suffix) comes from PyPI.
    (("2.13.0", "cuda", "12.8"), ("2.9.1", "cuda", "12.8"), "torch==2.13.0"),
])
def test_torch_paritys_pip_line_carries_the_index_of_the_build_the_node_needs(master, worker, command):
    art = torch_of(torch_of(clean(), "master", *master), "worker1", *worker)

    result = one(run_checks(context(art), [BY_ID["torch-parity"]]), "torch-parity", "worker1")

    assert result.status is Status.FAIL
    assert result.fix == f"ssh worker1 '{PYTHON} -m pip install {command}'"


def test_one_interface_pin_seen_by_two_checks_is_one_fix_with_both_named():
    report = Report(tuple(run_checks(context(faulted()), CHECKS)), ("master", "worker1"))

    said = [s for s in report.fixes if s.text == "export GLOO_SOCKET_IFNAME=wlp3s0   # on worker1"]
    assert [[(r.check, r.node, r.status) for r in s.results] for s in said] == [
        [("address-family", "worker1", Status.FAIL), ("interface-choice", "worker1", Status.WARN)]]
    shown = text.render(report, width=400, color=False)
    lines = [line.strip() for line in shown.splitlines()]
    number = next(n for n, s in enumerate(report.fixes, 1) if s == said[0])
    assert lines.count(f"{number}. export GLOO_SOCKET_IFNAME=wlp3s0   # on worker1; seen by address-family, "
                       "interface-choice") == 1
    assert sum("GLOO_SOCKET_IFNAME=wlp3s0" in line for line in lines) == 1
    # Both rows of the table point at that one fix.
    cells = [[cell.strip() for cell in line.split("\u2502")[1:-1]] for line in lines if line.count("\u2502") > 4]
    assert [row[:4] for row in cells if row[1] == "worker1" and row[0] in ("address-family", "interface-choice")] == \
        [["address-family", "worker1", "fail", str(number)], ["interface-choice", "worker1", "warn", str(number)]]
    # The JSON report is unchanged: each result keeps its own fix.
    document = report.to_json()
    assert [r["fix"] for r in document["results"] if r["check"] in ("address-family", "interface-choice")
            and r["node"] == "worker1"] == ["export GLOO_SOCKET_IFNAME=wlp3s0   # on worker1"] * 2


def test_a_firewall_seen_by_ephemeral_ports_and_collectives_is_fixed_once():
    art = json.loads(COLLECTIVES.read_text())["firewall@worker1"]
    nodes = tuple(NodeFacts(n["node"], n["facts"], n["error"], n["fix"]) for n in art["nodes"])
    report = Report(tuple(run_checks(Context(nodes, Options(master_addr=art["master_addr"]), art["probes"]),
                                     CHECKS)), ("master", "worker1"))

    shared = [s for s in report.fixes if len(s.results) > 1]
    assert [[(r.check, r.node) for r in s.results] for s in shared] == \
        [[("ephemeral-ports", "worker1"), ("collectives", None)]]
    (line,) = [line for line in text.render(report, width=600, color=False).splitlines() if "ufw allow" in line]
    assert line.endswith("; seen by ephemeral-ports, collectives")
    assert len(report.fixes) == len({r.fix for r in report.results if r.fix and r.status.severity >= 1})


def test_a_loopback_bind_seen_by_two_checks_is_one_fix():
    # Issue 38: 127.0.1.1 printed two fixes for one cause, address-family's with its /etc/hosts note
    # and interface-choice's without it.
    results = run_checks(context(ff.loopback_bind(clean(), "worker1")), CHECKS)
    fixes = {(r.check, r.node): r.fix for r in results if r.check in ("address-family", "interface-choice") and r.fix}
    assert fixes == {(c, "worker1"): "export GLOO_SOCKET_IFNAME=eth0   # on worker1: or map worker1 to its LAN "
                                      "address in /etc/hosts" for c in ("address-family", "interface-choice")}
    report = Report(tuple(results), ("master", "worker1"))
    assert sum("GLOO_SOCKET_IFNAME" in s.text for s in report.fixes) == 1
