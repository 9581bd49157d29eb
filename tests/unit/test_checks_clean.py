"""On the lab without faults every check passes, or skips for a stated reason."""

from __future__ import annotations

import json

from ddp_preflight.preflight.checks import FACT_CHECKS as CHECKS  # facts only: probes have their own tests
from ddp_preflight.preflight.checks import run_checks
from ddp_preflight.preflight.model import Report, Status

from .facts_fixtures import clean, context, one

NODES = ("master", "worker1")
# Checks that say something about each node, and checks that speak for the cluster (node None).
PER_NODE = {"node-reachable", "torch-parity", "python-parity", "address-family", "interface-choice",
            "stale-processes", "data-shards", "device-dtype", "ranks-per-node", "omp-threads", "ptrace",
            "clock-skew"}


def clean_results():
    # The recorder parsed the same seed-000 command for lab_clean as for lab_faulted, so the clean
    # artifact's launch facts hold that fault too: the clean run is one without a training command.
    return run_checks(context(clean(), launch_args=()), CHECKS)


def test_every_check_passes_or_skips():
    results = clean_results()

    bad = [(r.check, r.node, r.status.value, r.summary) for r in results
           if r.status not in (Status.PASS, Status.SKIP)]
    assert bad == []
    assert Report(tuple(results), NODES).ok_strict()


def test_every_check_reports():
    results = clean_results()

    assert {r.check for r in results} == {c.id for c in CHECKS}
    for check in PER_NODE:
        assert [r.node for r in results if r.check == check] == list(NODES), check
    assert [r.node for r in results if r.check == "master-port"] == ["master"]


GPU_CHECKS = {"gpu-visible", "nccl-parity", "gpu-memory-held", "gpu-health", "nccl-env"}


def test_only_the_two_checks_without_input_and_the_gpu_checks_skip():
    results = clean_results()

    skipped = {r.check: r for r in results if r.status is Status.SKIP}
    # code-parity: the recorder passed no --code-dir, so no node has code facts to compare.
    # launch-args, training-imports: no training command after --.
    # The GPU checks: a CPU run, once each for the cluster. The Slurm checks: not inside a job.
    assert set(skipped) == {"code-parity", "launch-args", "training-imports", "slurm-allocation",
                            "slurm-time-left"} | GPU_CHECKS
    for check in GPU_CHECKS:
        assert [(r.node, r.summary) for r in results if r.check == check] == [(None, "not a GPU run (--device cpu)")]
    assert skipped["code-parity"].node is None
    assert skipped["code-parity"].summary == "no training code given"
    assert "--code-dir PATH" in skipped["code-parity"].fix
    assert skipped["launch-args"].node is None
    assert skipped["launch-args"].summary.startswith("no training command given")


def test_passes_say_what_was_found():
    results = clean_results()

    assert one(results, "torch-parity", "worker1").summary == "torch 2.13.0+cpu (cpu), same as the master"
    assert one(results, "address-family", "worker1").summary == \
        "Gloo binds IPv4 10.213.0.11 on eth0 (its hostname worker1 resolves to it)"
    # The master's own route to its address goes over lo; the interface holding it is eth0.
    assert one(results, "interface-choice", "master").details["interface"] == "eth0"
    assert one(results, "interface-choice", "worker1").details["env"] == {"GLOO_SOCKET_IFNAME": "eth0"}
    assert one(results, "master-port", "master").summary == "port 29500 is free on master"
    assert one(results, "data-shards", "worker1").summary.endswith("identical to master")
    assert one(results, "clock-skew", "master").summary == "is the master"
    assert all(r.fix is None for r in results if r.status is Status.PASS)


def test_clean_report_is_plain_json():
    results = clean_results()
    document = json.loads(json.dumps(Report(tuple(results), NODES).to_json()))

    assert document["ok"] is True
    assert len(document["results"]) == len(results)
