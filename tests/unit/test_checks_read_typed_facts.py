"""The checks read typed facts (rules/facts/) and yield verdicts; the registry is the one
place their ids are written and the runner stamps each verdict with its check's id."""

from __future__ import annotations

import re
from pathlib import Path

from ddp_preflight.preflight.checks import BY_ID, CHECKS, FACT_CHECKS, run_checks
from ddp_preflight.preflight.model import Check, Context, NodeFacts, Status, Verdict
from ddp_preflight.rules.facts import NetworkFacts
from ddp_preflight.rules.fix import change

from . import facts_fixtures as ff
from . import gpu_fixtures as g

PREFLIGHT = Path(__file__).parents[2] / "ddp_preflight" / "preflight"


def test_the_runner_stamps_each_verdict_with_its_checks_id():
    def says_twice(ctx):
        yield Verdict(Status.PASS, "master", "fine")
        yield Verdict(Status.WARN, None, "hm", change("do this"))   # a Fix; the result says its text
    results = run_checks(Context((NodeFacts("master", {}),)), [Check("made-up", "yields two verdicts", says_twice)])
    assert [(r.check, r.status, r.node, r.summary, r.fix) for r in results] == \
        [("made-up", Status.PASS, "master", "fine", None), ("made-up", Status.WARN, None, "hm", "do this")]


def test_no_check_module_writes_an_id_the_registry_is_the_one_place():
    for module in (PREFLIGHT / "checks").glob("*.py"):
        if module.name == "__init__.py":
            continue
        text = module.read_text()
        assert not re.search(r"^\s*(CHECK_)?ID\s*=", text, re.M), module.name
        assert "Result(" not in text, f"{module.name} builds results: checks yield verdicts"
    # Every id's function is named after it, in the module the registry names.
    for check in CHECKS:
        assert check.run.__name__ == "check_" + check.id.replace("-", "_")


def test_severity_orders_the_statuses():
    assert [s.severity for s in (Status.PASS, Status.SKIP, Status.WARN, Status.FAIL, Status.ERROR)] == [0, 0, 1, 2, 2]
    assert not hasattr(Status.PASS, "rank")     # a rank is a process here, never a severity


def test_a_check_reads_typed_facts_only():
    # The checks, the rules they share, the launch plan and the probes read NodeFacts.parsed, never the wire dict.
    for path in [*(PREFLIGHT / "checks").glob("*.py"), *(PREFLIGHT / "probes").glob("*.py"),
                 *(PREFLIGHT.parent / "rules").glob("*.py"), PREFLIGHT.parent / "launch" / "plan.py"]:
        text = path.read_text()
        assert ".facts.get(" not in text and ".facts[" not in text and ".section(" not in text, path.name


def test_a_node_whose_cpu_facts_lack_a_key_gets_an_error_result_naming_it_not_a_crash():
    art = ff.clean()
    del ff.facts(art, "worker1")["cpu"]["physical_cores"]      # a collector of another version
    results = run_checks(ff.context(art), FACT_CHECKS)

    assert not [r for r in results if r.summary.startswith("the check failed")]
    omp = ff.one(results, "omp-threads", "worker1")
    assert (omp.status, omp.summary) == (Status.ERROR, "worker1: the cpu facts could not be read: no physical_cores")
    assert ff.one(results, "omp-threads", "master").status is Status.PASS


def test_a_nodes_facts_are_parsed_once():
    node = NodeFacts("worker1", ff.facts(ff.clean(), "worker1"))
    assert node.parsed is node.parsed
    assert isinstance(node.parsed.network, NetworkFacts)


# --- a latent bug the types showed -------------------------------------------------------------

def test_a_failed_gpu_section_gives_its_error_not_an_older_collector():
    # The gpu checks took a failed gpu section for an absent one ("a collector older than this
    # check"); a failed section is Missing with the node's error, and they say it.
    error = "OSError: [Errno 5] Input/output error: '/dev' (at gpu.py:37)"
    broken = g.edited(g.h100(), lambda f: f.update(gpu={"error": error}))
    results = run_checks(g.context(("h100", broken)), [BY_ID["gpu-memory-held"], BY_ID["gpu-health"]])
    assert [(r.status, r.summary) for r in results] == [(Status.SKIP, f"no GPU facts from h100: {error}")] * 2
    # The lab's gpu sections come from a collector before the driver view, and say so.
    lab = run_checks(ff.context(ff.clean(), device="cuda", backend="nccl"), [BY_ID["gpu-memory-held"]])
    assert {r.summary for r in lab} == {
        f"no GPU facts from {n}: not collected (a collector older than this check)" for n in ("master", "worker1")}
