"""master-reachable and ephemeral-ports, judged from recorded real probe data of the lab."""

import copy
import json

from preflight.checks import BY_ID, run_checks
from preflight.model import Context, NodeFacts, Options, Status

from .facts_fixtures import _recorded

PORT_CHECKS = [BY_ID["master-reachable"], BY_ID["ephemeral-ports"]]


def load(name):
    return json.loads(_recorded(name))


def ctx_of(art, probes=None):
    nodes = tuple(NodeFacts(n["node"], n["facts"], n["error"], n["fix"]) for n in art["nodes"])
    return Context(nodes, Options(master_addr=art["master_addr"]), art["probes"] if probes is None else probes)


def results(art, probes=None):
    return {(r.check, r.node): r for r in run_checks(ctx_of(art, probes), PORT_CHECKS)}


def test_the_clean_lab_passes_both_checks_in_both_directions():
    got = results(load("lab_probe_clean"))
    assert {k: r.status for k, r in got.items()} == {
        ("master-reachable", "worker1"): Status.PASS,
        ("ephemeral-ports", "master"): Status.PASS, ("ephemeral-ports", "worker1"): Status.PASS}


def test_firewalls_on_both_nodes_fail_where_gloo_listens_and_warn_where_it_does_not():
    got = results(load("lab_probe_firewalls"))
    worker, master = got[("ephemeral-ports", "worker1")], got[("ephemeral-ports", "master")]
    # worker1 (10.213.x.11) is below the master (.200): it listens, the master connects.
    assert worker.status is Status.FAIL and "from master: silently dropped" in worker.summary
    assert "master connects" in worker.summary and "Connect timeout" in worker.summary
    assert master.status is Status.WARN and "from worker1: silently dropped" in master.summary
    assert "sudo ufw allow from 10.213." in worker.fix and "/24 proto tcp to any port 32768:60999" in worker.fix
    assert got[("master-reachable", "worker1")].status is Status.PASS


def test_a_closed_port_that_times_out_is_a_firewall_even_if_listeners_answer():
    art = load("lab_probe_clean")
    probes = copy.deepcopy(art["probes"])
    for pair in probes["network"]["pairs"]:
        if pair["dst"] == "worker1" and pair["kind"] == "closed":
            pair["outcome"] = "filtered"      # derived: a rule that drops only some ports
    worker = results(art, probes)[("ephemeral-ports", "worker1")]
    assert worker.status is Status.FAIL and "silently dropped" in worker.summary


def test_a_probe_that_did_not_run_is_a_skip_or_an_error_never_a_pass():
    art = load("lab_probe_clean")
    assert all(r.status is Status.SKIP for r in results(art, {}).values())          # --no-probes
    skipped = results(art, {"network": {"skipped": "needs the master and at least one more reachable node"}})
    assert all(r.status is Status.SKIP for r in skipped.values())
    broken = results(art, {"network": {"error": "RuntimeError: boom"}})
    assert all(r.status is Status.ERROR and "boom" in r.summary for r in broken.values())


def test_an_unreachable_master_port_fails_with_the_rule_to_add():
    art = load("lab_probe_clean")
    probes = copy.deepcopy(art["probes"])
    for pair in probes["network"]["pairs"]:
        if pair["kind"] == "master":
            pair["outcome"] = "filtered"
    result = results(art, probes)[("master-reachable", "worker1")]
    assert result.status is Status.FAIL and "rendezvous will time out" in result.summary
    assert "port 29500" in result.fix
