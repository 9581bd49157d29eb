"""`ddp-preflight` against the lab: each fault caught on the right node, bad input isolated."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "ddp_preflight"]
GPU_CHECKS = ("gpu-visible", "nccl-parity", "gpu-memory-held", "gpu-health", "nccl-env")


def preflight(lab, *args, hosts=("master", "worker1"), ssh_config=None, expect=None, cwd=None):
    done = subprocess.run([*CLI, *hosts, "--json", "--ssh-config", str(ssh_config or lab.ssh_config),
                           *args], capture_output=True, text=True, timeout=120, cwd=cwd)
    assert "Traceback" not in done.stderr, done.stderr
    report = json.loads(done.stdout) if done.stdout.strip() else None
    if expect is not None:
        assert done.returncode == expect, (done.returncode, done.stdout[-3000:], done.stderr)
    return done, report


def by(report, check, node=None):
    found = [r for r in report["results"] if r["check"] == check and (node is None or r["node"] == node)]
    assert found, f"no {check} result for {node}"
    return found[0] if node is not None else found


def statuses(report):
    return {(r["check"], r["node"]): r["status"] for r in report["results"]}


@pytest.fixture
def code_dir(tmp_path):
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "train.py").write_text("print('train')\n")
    return folder


def test_a_clean_lab_passes_every_check(clean_lab, code_dir):
    # From the code's folder, as its user runs it: there, train.py is the script (training-imports).
    _, report = preflight(clean_lab, "--data-dir", str(clean_lab.state.data_dir),
                          "--code-dir", str(code_dir), "--", "train.py", "--depth", "4", expect=0, cwd=code_dir)
    assert report["ok"] is True and report["nodes"] == ["master", "worker1"]
    # The GPU checks skip a CPU run, once each.
    gpu = [r for r in report["results"] if r["check"] in GPU_CHECKS]
    assert [(r["check"], r["node"], r["status"]) for r in gpu] == [(c, None, "skip") for c in GPU_CHECKS]
    # Over ssh there is no Slurm job: the Slurm checks skip, once each.
    slurm = [(r["check"], r["node"], r["status"]) for r in report["results"] if r["check"].startswith("slurm-")]
    assert slurm == [("slurm-allocation", None, "skip"), ("slurm-time-left", None, "skip")]
    bad = [r for r in report["results"] if r["status"] != "pass" and r["check"] not in GPU_CHECKS
           and not r["check"].startswith("slurm-")]
    # Nothing to say on a clean lab (issue 26: it printed five general notes about Gloo). Gloo's
    # own measured gaps (torch 2.13: futures on reduce_scatter and isend/irecv, PREMUL_SUM, uneven
    # all_gather) are kept with the passes, each with its workaround: no training code was given.
    assert bad == []
    gaps = [r for r in report["results"] if r["check"] == "collectives" and "workaround" in r["details"]]
    assert {(r["details"]["op"], r["status"]) for r in gaps} == {
        (op, "pass") for op in ("reduce_scatter_tensor", "reduce_scatter", "isend_irecv", "all_reduce_premul_sum",
                                "all_gather_uneven")}
    # Every per-node check reports on both nodes.
    for check in ("node-reachable", "torch-parity", "address-family", "data-shards", "code-parity"):
        assert {r["node"] for r in by(report, check)} == {"master", "worker1"}
    assert by(report, "interface-choice", "worker1")["details"]["env"] == {"GLOO_SOCKET_IFNAME": "eth0"}


def test_vpn_ipv6_is_caught_as_an_address_family_mismatch_on_that_node(clean_lab):
    clean_lab.add_fault("vpn-ipv6@worker1")
    _, report = preflight(clean_lab, "--only", "address-family,interface-choice", expect=1)
    result = by(report, "address-family", "worker1")
    assert result["status"] == "fail"
    assert "10 vs 2" in result["summary"] and "tailscale0" in result["summary"]
    assert result["fix"].startswith("export GLOO_SOCKET_IFNAME=eth0")
    assert by(report, "address-family", "master")["status"] == "pass"


def test_every_node_binding_ipv6_behind_an_ipv4_master_address_passes_and_trains_and_one_alone_fails(clean_lab):
    # Issue 26: with every hostname resolving to IPv6, address-family failed every node with an
    # ss_family error that does not happen (it compared each node with the IPv4 master address).
    # Gloo's pairs connect device to device: all that matters is that every rank binds one family.
    from .ddp import run_job
    clean_lab.add_fault("ipv6-host@master")
    clean_lab.add_fault("ipv6-host@worker1")
    _, report = preflight(clean_lab, "--only", "address-family", expect=0)
    assert {(r["node"], r["status"], r["summary"]) for r in by(report, "address-family")} == {
        (name, "pass", f"Gloo binds IPv6 {clean_lab.node(name).ipv6} on eth0 (its hostname {name} resolves to it)")
        for name in ("master", "worker1")}
    # The real thing, unpinned, MASTER_ADDR the master's IPv4: the group forms and the all_reduce is right.
    outcomes = run_job(clean_lab, ["master", "worker1"], port=29571, pg_timeout=15)
    assert [(o.returncode, o.result.get("ok")) for o in outcomes] == [(0, True), (0, True)], \
        [o.output[-1500:] for o in outcomes]
    # One node alone on IPv6: the failure is there, on worker1, against master's IPv4 ranks, and real.
    clean_lab.clear_faults(["ipv6-host@master"])
    _, report = preflight(clean_lab, "--only", "address-family", expect=1)
    results = {r["node"]: r for r in by(report, "address-family")}
    assert {name: r["status"] for name, r in results.items()} == {"master": "pass", "worker1": "fail"}
    assert results["worker1"]["summary"] == (
        f"Gloo on worker1 will bind IPv6 {clean_lab.node('worker1').ipv6} on eth0 (its hostname worker1 resolves to "
        "it) while master's ranks bind IPv4: every pair of ranks connects these addresses, and process-group "
        "creation fails with 'ss1.ss_family == ss2.ss_family. 10 vs 2'")
    outcomes = run_job(clean_lab, ["master", "worker1"], port=29572, pg_timeout=10)
    errors = " ".join(o.result.get("error", "") for o in outcomes)
    assert "ss1.ss_family == ss2.ss_family" in errors, [o.output[-1500:] for o in outcomes]


def test_loopback_host_is_caught(clean_lab):
    clean_lab.add_fault("loopback-host@worker1")
    _, report = preflight(clean_lab, "--only", "address-family", expect=1)
    result = by(report, "address-family", "worker1")
    assert result["status"] == "fail" and "127.0.1.1" in result["summary"] and "loopback" in result["summary"]
    assert "GLOO_SOCKET_IFNAME=eth0" in result["fix"]


def test_wifi_is_a_warning_that_strict_turns_into_a_failure(clean_lab):
    clean_lab.add_fault("wifi@worker1")
    _, report = preflight(clean_lab, "--only", "interface-choice", expect=0)
    result = by(report, "interface-choice", "worker1")
    assert result["status"] == "warn" and "wlp3s0" in result["summary"] and "Wi-Fi" in result["summary"]
    assert result["details"]["kind"] == "wireless"
    _, strict = preflight(clean_lab, "--only", "interface-choice", "--strict", expect=1)
    assert report["ok"] is True and strict["ok"] is False     # the JSON says what the exit code says


def test_a_lossy_path_is_named_at_the_node_it_leads_to_and_a_clean_one_says_nothing(clean_lab):
    # Issue 26: a lossy link passed bandwidth (loss never measured). The senders' own TCP_INFO
    # (bytes sent again over bytes sent) names it, on the way into the node that drops packets.
    _, clean = preflight(clean_lab, "--only", "bandwidth", expect=0)
    assert [r["status"] for r in by(clean, "bandwidth")] == ["pass"], clean
    clean_lab.add_fault("lossy@worker1:2")
    _, lossy = preflight(clean_lab, "--only", "bandwidth", expect=0)
    results = by(lossy, "bandwidth")
    assert sorted((r["status"], r["node"] or "-") for r in results) == [("pass", "-"), ("warn", "worker1")], results
    loss = by(lossy, "bandwidth", "worker1")
    assert loss["summary"].startswith("packets are lost on the way from master to worker1: "), loss
    toward = next(link for link in loss["details"]["links"] if (link["src"], link["dst"]) == ("master", "worker1"))
    assert toward["lost"] / toward["segs"] >= 0.005 and toward["segs"] >= 1000, toward
    # The lab's loss is worker1's own nftables rule (issue 38: named with a whole command that
    # deletes it); applied as printed, the path is clean again.
    chain = "inet ddp_lab_lossy input"
    assert loss["fix"] == (
        f"on worker1: sudo nft delete rule {chain} handle $(sudo nft -a list chain {chain} | grep -F 'meta l4proto tcp "
        f"numgen random mod 1000 < 20 drop #' | sed 's/.*# handle //')   # the rule in {chain} that drops a random "
        "share of what worker1 receives"), loss["fix"]
    command = loss["fix"].removeprefix("on worker1: ").split("   #")[0].replace("sudo ", "")   # root, no sudo here
    clean_lab.exec("worker1", ["sh", "-c", command], check=True)
    _, fixed = preflight(clean_lab, "--only", "bandwidth", expect=0)
    assert [r["status"] for r in by(fixed, "bandwidth")] == ["pass"], fixed


def test_a_leftover_process_on_the_master_port_is_named_by_pid(clean_lab):
    clean_lab.add_fault("port-busy@master")
    pid = clean_lab.state.faults[-1].undo[0]["pid"]
    _, report = preflight(clean_lab, "--only", "master-port,stale-processes", expect=1)
    port = by(report, "master-port", "master")
    assert port["status"] == "fail" and f"PID {pid}" in port["summary"] and "train.py" in port["summary"]
    assert port["fix"].startswith(f"kill {pid}")
    stale = by(report, "stale-processes", "master")
    # Its parent is this test process, so it is a leftover but not an orphan: a warning.
    assert stale["status"] == "warn" and f"PID {pid}" in stale["summary"] and "orphan" not in stale["summary"]
    # The same kernel runs both lab nodes; worker1 must not report the master's process.
    assert by(report, "stale-processes", "worker1")["status"] == "pass"


def test_a_shard_mismatch_names_missing_and_changed_files(clean_lab):
    clean_lab.add_fault("shards@worker1")
    _, report = preflight(clean_lab, "--only", "data-shards", "--data-dir", str(clean_lab.state.data_dir), expect=1)
    result = by(report, "data-shards", "worker1")
    assert result["status"] == "fail"
    assert "4 missing" in result["summary"] and "shard_00000.parquet" in result["summary"]
    assert "rsync" in result["fix"]
    assert by(report, "data-shards", "master")["status"] == "pass"


def test_torchrun_swallowing_script_options_is_caught(clean_lab):
    _, report = preflight(clean_lab, "--only", "launch-args", "--", "-m", "scripts.base_train", "--run=x", expect=1)
    result = by(report, "launch-args", "master")
    assert result["status"] == "fail" and "--run" in result["summary"]
    assert "scripts.base_train -- --run=x" in result["fix"]
    preflight(clean_lab, "--only", "launch-args", "--", "-m", "scripts.base_train", "--", "--run=x", expect=0)


def test_nccl_on_a_cpu_run_fails_on_every_node(clean_lab):
    _, report = preflight(clean_lab, "--only", "device-dtype", "--backend", "nccl", expect=1)
    assert {r["node"]: r["status"] for r in report["results"]} == {"master": "fail", "worker1": "fail"}


def test_code_that_differs_between_nodes_is_caught(clean_lab, tmp_path, code_dir):
    other = tmp_path / "other"
    shutil.copytree(code_dir, other)
    (other / "train.py").write_text("print('changed')\n")
    config = tmp_path / "cluster.toml"
    config.write_text(f'code_dir = "{code_dir}"\n[nodes.worker1]\ncode_dir = "{other}"\n')
    _, report = preflight(clean_lab, "--only", "code-parity", "--config", str(config), expect=1)
    assert by(report, "code-parity", "worker1")["status"] == "fail"
    assert by(report, "code-parity", "master")["status"] == "pass"


def test_an_unreachable_host_does_not_stop_the_report(clean_lab):
    # A host name that could be an injection (`w;id`) is no longer a node's error here: it is
    # refused before anything is done, in one line, exit 2 (tests/unit/test_hostile_hosts.py).
    done, report = preflight(clean_lab, "--only", "node-reachable,torch-parity",
                             hosts=("master", "ghost", "worker1"), expect=1)
    reach = {r["node"]: r for r in by(report, "node-reachable")}
    assert reach["master"]["status"] == reach["worker1"]["status"] == "pass"
    assert reach["ghost"]["status"] == "error" and "does not resolve" in reach["ghost"]["summary"]
    assert {r["node"] for r in by(report, "torch-parity")} == {"master", "worker1"}


def test_a_refused_key_is_an_error_with_the_fix(clean_lab, tmp_path):
    key = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    text = Path(clean_lab.ssh_config).read_text()
    config = tmp_path / "ssh_config"
    config.write_text(text.replace(str(clean_lab.state.ssh_dir / "id_ed25519"), str(key)))
    _, report = preflight(clean_lab, "--only", "node-reachable", ssh_config=config, hosts=("worker1",), expect=1)
    result = by(report, "node-reachable", "worker1")
    assert result["status"] == "error" and "refused" in result["summary"] and "ssh-copy-id" in result["fix"]


def test_an_unknown_host_key_is_refused_not_trusted(clean_lab, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    text = Path(clean_lab.ssh_config).read_text()
    config = tmp_path / "ssh_config"
    config.write_text(text.replace(str(clean_lab.state.ssh_dir / "known_hosts"), str(empty)))
    _, report = preflight(clean_lab, "--only", "node-reachable", ssh_config=config, hosts=("worker1",), expect=1)
    result = by(report, "node-reachable", "worker1")
    assert result["status"] == "error" and "host key is not known" in result["summary"]
    assert "ssh-keyscan worker1" in result["fix"]


def test_a_wrong_python_is_an_error_naming_the_node(clean_lab):
    _, report = preflight(clean_lab, "--only", "node-reachable", "--python", "/nonexistent/bin/python", expect=1)
    for node in ("master", "worker1"):
        result = by(report, "node-reachable", node)
        assert result["status"] == "error" and "/nonexistent/bin/python" in result["summary"]
        assert "--python" in result["fix"]


def test_torch_missing_on_one_node_names_it_and_the_install(clean_lab, tmp_path):
    bare = shutil.which("python3", path="/usr/bin:/usr/local/bin")
    if subprocess.run([bare, "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.fail(f"{bare} has torch; this test needs a Python without it")
    config = tmp_path / "cluster.toml"
    config.write_text(f'[nodes.worker1]\npython = "{bare}"\n')
    _, report = preflight(clean_lab, "--only", "torch-parity", "--config", str(config), expect=1)
    result = by(report, "torch-parity", "worker1")
    assert result["status"] == "fail" and "torch is not installed" in result["summary"]
    assert f"{bare} -m pip install torch==2.13.0" in result["fix"]
    assert by(report, "torch-parity", "master")["status"] == "pass"


def test_a_missing_data_folder_is_an_error_per_node(clean_lab):
    _, report = preflight(clean_lab, "--only", "data-shards", "--data-dir", "/nonexistent/shards", expect=1)
    for node in ("master", "worker1"):
        result = by(report, "data-shards", node)
        assert result["status"] == "error" and "/nonexistent/shards" in result["summary"]


def test_a_bad_config_is_a_one_line_usage_error(clean_lab, tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text("python = [unclosed\n")
    done, report = preflight(clean_lab, "--config", str(config), expect=2)
    assert report is None and done.stderr.count("\n") == 1 and "not valid TOML" in done.stderr


def test_junit_has_one_testcase_per_check_and_node(clean_lab, tmp_path):
    clean_lab.add_fault("port-busy@master")
    junit = tmp_path / "preflight.xml"
    _, report = preflight(clean_lab, "--junit", str(junit), expect=1)
    cases = ET.parse(junit).getroot().findall("./testsuite/testcase")
    assert len(cases) == len(report["results"])
    failed = {c.get("name") for c in cases if c.find("failure") is not None}
    assert "master-port [master]" in failed


def test_preflight_leaves_nothing_running_on_the_nodes(clean_lab):
    before = {n.name: sorted(clean_lab.processes(n.name)) for n in clean_lab.nodes}
    preflight(clean_lab, "--data-dir", str(clean_lab.state.data_dir), expect=0)
    after = {n.name: sorted(clean_lab.processes(n.name)) for n in clean_lab.nodes}
    assert after == before


def test_a_node_that_drops_what_it_sends_is_named_itself(clean_lab):
    # Issue 38: worker1 dropping 5% of what it sends passed bandwidth: its kernel sends those
    # segments again as if new, counting no resend, so the resends said nothing. Segments sent and
    # never acknowledged say it, and name the sender: they never left it.
    clean_lab.add_fault("lossy-out@worker1:5")
    _, lossy = preflight(clean_lab, "--only", "bandwidth", expect=0)
    results = by(lossy, "bandwidth")
    assert sorted((r["status"], r["node"] or "-") for r in results) == [("pass", "-"), ("warn", "worker1")], results
    loss = by(lossy, "bandwidth", "worker1")
    assert loss["summary"].startswith("worker1 drops what it sends to master: "), loss
    assert "were never acknowledged, and its kernel counted no resend for them" in loss["summary"], loss
    out = next(link for link in loss["details"]["links"] if (link["src"], link["dst"]) == ("worker1", "master"))
    assert out["undelivered"] / out["segs"] >= 0.02 and out["lost"] * 2 < out["undelivered"], out
    chain = "inet ddp_lab_lossy_out output"
    assert loss["fix"] == (
        f"on worker1: sudo nft delete rule {chain} handle $(sudo nft -a list chain {chain} | grep -F 'meta l4proto tcp "
        f"numgen random mod 1000 < 50 drop #' | sed 's/.*# handle //')   # the rule in {chain} that drops a random "
        "share of what worker1 sends"), loss["fix"]
