"""Fixes are data at the source (rules/fix.py): every check yields a Fix (what to run, set or
change, on which node), and the report's `fix` string, the JSON contract, is its text."""

from __future__ import annotations

import json

from ddp_preflight.preflight.checks import CHECKS, run_checks
from ddp_preflight.preflight.model import Context, NodeFacts, Options
from ddp_preflight.rules.environment import env_fix
from ddp_preflight.rules.fix import Action, Fix, change, on_node, run
from ddp_preflight.rules.ports import who_holds
from ddp_preflight.rules.training_env import TrainingEnv, parse_env_args

from . import facts_fixtures as ff
from .facts_fixtures import ARTIFACTS

PROBED = ("lab_probe_firewalls", "lab_probe_self_firewall", "lab_path_mtu_blackhole", "lab_compute_straggler",
          "lab_bandwidth_wifi")


def contexts():
    yield ff.context(ff.faulted())
    # Under --launch, with a setting given for one node: the fixes are --env flags and config lines.
    given = TrainingEnv(tuple(parse_env_args(["worker1:OMP_NUM_THREADS=4"], ["master", "worker1"])), "cluster.toml")
    yield ff.context(ff.faulted(), launch=True, env=given)
    for name in PROBED:
        art = json.loads((ARTIFACTS / f"{name}.json").read_text())
        nodes = tuple(NodeFacts(n["node"], n["facts"], n.get("error"), n.get("fix")) for n in art["nodes"])
        yield Context(nodes, Options(master_addr=art.get("master_addr"), nproc_per_node=art.get("nproc_per_node", 1),
                                     params=126_000_000), art.get("probes", {}))
    recorded = json.loads((ARTIFACTS / "collectives_gloo_2node.json").read_text())
    for art in recorded.values():        # each lab fault's collectives matrix
        nodes = tuple(NodeFacts(n["node"], n["facts"], n.get("error"), n.get("fix")) for n in art["nodes"])
        yield Context(nodes, Options(master_addr=art["master_addr"]), art["probes"])


def test_every_checks_fix_is_a_fix_and_the_report_says_its_text():
    seen = 0
    for ctx in contexts():
        for check in CHECKS:
            verdicts = list(check.run(ctx))
            results = run_checks(ctx, [check])
            assert [r.fix for r in results] == [None if v.fix is None else v.fix.text() for v in verdicts], check.id
            for v in verdicts:
                assert v.fix is None or isinstance(v.fix, Fix), (check.id, v.fix)
                seen += v.fix is not None
    assert seen >= 10      # the faulted lab and the probes' recordings have findings with fixes


def test_a_fix_says_what_kind_where_and_renders_as_the_report_always_did():
    kill = run("kill 4242", "master", "on master; or choose another port with --master-port")
    assert (kill.action, kill.node) == (Action.RUN, "master")
    assert kill.text() == "kill 4242   # on master; or choose another port with --master-port"
    assert on_node("worker1", "pip install 'torch==2.9.1'").text() == "ssh worker1 'pip install '\"'\"'torch==2.9.1'\"'\"''"
    assert who_holds("master", 29500).text() == "sudo ss -ltnp 'sport = :29500'   # on master, to see who; or use --master-port"
    assert change("--backend gloo").steps == ("--backend gloo",) and change("x").action is Action.CHANGE


def test_the_environment_fix_is_a_setting_for_its_node():
    ctx = ff.context(ff.clean())
    fix = env_fix(ctx, "worker1", [("GLOO_SOCKET_IFNAME", "eth0"), ("OMP_NUM_THREADS", "4")], note="why")
    assert (fix.action, fix.node, fix.steps) == (Action.SET, "worker1", ("export GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=4",))
    assert fix.text() == "export GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=4   # on worker1: why"
