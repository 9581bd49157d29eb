"""On the faulted lab each seeded fault is caught by its check, on its node, with its fix.

lab_faulted: worker1 resolves its hostname to a Tailscale IPv6 address (vpn-ipv6), reaches the
master over Wi-Fi (wifi), holds 4 of the master's 8 shards with shard 0 altered (shards); the
master has a leftover orphan on port 29500 (port-busy); the command is seed 000's `--run=x`."""

from __future__ import annotations

import pytest

from ddp_preflight.preflight.checks import FACT_CHECKS as CHECKS  # facts only: probes have their own tests
from ddp_preflight.preflight.checks import run_checks
from ddp_preflight.preflight.model import Status

from .facts_fixtures import RECORDED_LAUNCH_ARGS, context, entry, facts, faulted, one


@pytest.fixture(scope="module")
def results():
    return run_checks(context(faulted()), CHECKS)


def test_the_recorded_faults_are_the_ones_tested():
    art = faulted()
    assert [n["faults"] for n in art["faults"]] == [
        ["port-busy@master:29500"],
        ["firewall@worker1", "vpn-ipv6@worker1", "wifi@worker1:50mbit", "shards@worker1"]]
    assert context(art).options.launch_args == RECORDED_LAUNCH_ARGS


def test_address_family_fails_on_worker1_with_the_interface_to_the_master(results):
    route = facts(faulted(), "worker1")["network"]["route_to_master"]
    assert route["interface"] == "wlp3s0"           # worker1 reaches the master over its Wi-Fi

    result = one(results, "address-family", "worker1")

    assert result.status is Status.FAIL
    assert "IPv6 fd7a:115c:a1e0::11 on tailscale0" in result.summary
    assert "'ss1.ss_family == ss2.ss_family. 10 vs 2'" in result.summary   # seed 004's error
    assert "GLOO_SOCKET_IFNAME=wlp3s0" in result.fix
    assert result.details["reference_family"] == 4


def test_address_family_passes_on_the_master(results):
    result = one(results, "address-family", "master")

    assert result.status is Status.PASS
    assert result.summary.startswith("Gloo binds IPv4 10.213.0.200 on eth0")


def test_interface_choice_on_worker1_names_the_wireless_link(results):
    result = one(results, "interface-choice", "worker1")

    assert result.status is Status.WARN
    assert "via wlp3s0 (wireless)" in result.summary
    assert "Gloo would bind tailscale0" in result.summary
    assert "Wi-Fi" in result.summary
    assert "GLOO_SOCKET_IFNAME=wlp3s0" in result.fix
    assert result.details["kind"] == "wireless"


def test_interface_choice_passes_on_the_master(results):
    result = one(results, "interface-choice", "master")

    assert result.status is Status.PASS
    assert result.details["interface"] == "eth0"


def test_master_port_fails_naming_the_pid_that_holds_it(results):
    holder = facts(faulted(), "master")["master_port"]["holders"][0]
    assert holder["pid"] == 16882

    result = one(results, "master-port", "master")

    assert result.status is Status.FAIL
    assert "port 29500 on master is held by PID 16882" in result.summary
    assert "orphan" in result.summary
    assert "EADDRINUSE" in result.summary
    assert result.fix.startswith("kill 16882 ")
    assert [r.node for r in results if r.check == "master-port"] == ["master"]


def test_stale_processes_fails_on_the_master_only(results):
    result = one(results, "stale-processes", "master")

    assert result.status is Status.FAIL       # the leftover is an orphan
    assert "1 training process already on master (1 orphaned)" in result.summary
    assert "PID 16882" in result.summary
    assert result.fix.startswith("kill 16882 ")
    assert one(results, "stale-processes", "worker1").status is Status.PASS


def test_data_shards_fails_on_worker1_naming_missing_and_differing_files(results):
    result = one(results, "data-shards", "worker1")

    assert result.status is Status.FAIL
    assert result.summary.startswith("worker1 has 4 of the master's 8 shards")
    assert result.details["missing"] == [f"shard_0000{i}.parquet" for i in range(4, 8)]
    assert result.details["differs"] == ["shard_00000.parquet"]
    for name in ("shard_00004.parquet", "shard_00007.parquet", "shard_00000.parquet"):
        assert name in result.summary
    # Pulled from the master's address as worker1 dials it.
    assert "rsync -a --delete 10.213.0.200:/run/ddp-preflight/lab/data/" in result.fix
    assert one(results, "data-shards", "master").status is Status.PASS


def test_launch_args_fails_and_puts_the_options_after_the_separator(results):
    result = one(results, "launch-args", "master")

    assert result.status is Status.FAIL
    assert "ambiguous option: --run=x" in result.summary
    assert result.fix.endswith("torchrun ... -m scripts.base_train -- --run=x --depth 4")


def test_no_fault_is_reported_against_a_node_without_it(results):
    flagged = {(r.check, r.node) for r in results if r.status is not Status.PASS}

    assert flagged == {
        ("code-parity", None),                  # skip: no code facts were recorded
        ("training-imports", "master"), ("training-imports", "worker1"),   # skip: recorded before the check
        ("address-family", "worker1"),
        ("interface-choice", "worker1"),
        ("master-port", "master"),
        ("stale-processes", "master"),
        ("data-shards", "worker1"),
        ("launch-args", "master"),
        ("gpu-visible", None), ("nccl-parity", None),          # skip: a CPU run
        ("gpu-memory-held", None), ("gpu-health", None), ("nccl-env", None),
        ("slurm-allocation", None), ("slurm-time-left", None),   # skip: not inside a Slurm job
    }
    assert one(results, "code-parity", None).status is Status.SKIP
    assert {one(results, "training-imports", n).status for n in ("master", "worker1")} == {Status.SKIP}


def test_the_faults_come_from_the_facts_not_the_node_names():
    # The same faulted facts under other node names: the findings follow the facts.
    art = faulted()
    entry(art, "master")["node"] = "ws"
    entry(art, "worker1")["node"] = "laptop"
    renamed = run_checks(context(art), CHECKS)

    assert one(renamed, "address-family", "laptop").status is Status.FAIL
    assert one(renamed, "master-port", "ws").status is Status.FAIL
    assert one(renamed, "data-shards", "laptop").status is Status.FAIL
