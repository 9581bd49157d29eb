"""The collectives probe over the lab: a real torchrun job on both nodes, Gloo, torch 2.13."""

from __future__ import annotations

import time

from .test_preflight_lab import by, preflight

ONLY = ("--only", "collectives")


def listening(lab, node):
    return sorted(line for line in lab.exec(node, ["ss", "-Htln"]).stdout.split("\n") if line)


def snapshot(lab):
    return {n.name: (sorted(lab.processes(n.name)), listening(lab, n.name)) for n in lab.nodes}


def settled(lab, before, within=5.0):
    """The nodes' processes and listeners as they were (an ssh session may take a moment to go)."""
    deadline = time.monotonic() + within
    while (now := snapshot(lab)) != before and time.monotonic() < deadline:
        time.sleep(0.2)
    return now


def timed(lab, *args, expect=None):
    started = time.monotonic()
    done, report = preflight(lab, *args, expect=expect)
    return done, report, time.monotonic() - started


def results_by_op(report):
    return {r["details"].get("op"): r for r in by(report, "collectives")}


def test_the_matrix_shows_seed_000s_get_future_failure_and_nothing_is_left(clean_lab, tmp_path):
    train = tmp_path / "train.py"
    train.write_text("import torch.distributed as dist\n\n\ndef step(out, inp):\n"
                     "    dist.all_reduce(inp)\n"
                     "    dist.reduce_scatter_tensor(out, inp, async_op=True).get_future()\n")
    before = snapshot(clean_lab)
    _, report, seconds = timed(clean_lab, *ONLY, "--scan", str(train), expect=1)
    results = results_by_op(report)
    rs = results["reduce_scatter_tensor"]
    assert rs["status"] == "fail" and rs["node"] is None
    assert "Work::getFuture not implemented" in rs["summary"] and "get_future()" in rs["summary"]
    assert "train.py:6" in rs["summary"] and rs["details"]["call_sites"][0]["line"] == 6
    assert "_async_op" in rs["fix"]
    matrix = rs["details"]["matrix"]
    assert matrix["reduce_scatter_tensor"]["async_future"]["float32"].endswith("Work::getFuture not implemented.")
    assert matrix["all_reduce_sum"]["sync"] == {"float32": "ok", "bfloat16": "ok", "float16": "ok"}
    assert matrix["reduce_scatter_tensor"]["sync"]["float32"] == "ok"
    assert rs["details"]["world"] == 2 and rs["details"]["seconds"] < 15
    # Seed 004's other gaps on this backend, measured too.
    assert "Cannot use ReduceOp.PREMUL_SUM" in results["all_reduce_premul_sum"]["summary"]
    assert "invalid tensor size" in results["all_gather_uneven"]["summary"]
    assert "getFuture" in results["isend_irecv"]["summary"]
    assert "all_reduce_sum" not in results                      # it passed: no result of its own
    assert seconds < 40
    # No rank, torchrun or supervisor left on any node, and the master port is free again.
    assert settled(clean_lab, before) == before


def test_vpn_ipv6_fails_fast_naming_address_family_then_measures_with_the_pin(clean_lab):
    clean_lab.add_fault("vpn-ipv6@worker1")
    before = snapshot(clean_lab)
    _, report, seconds = timed(clean_lab, *ONLY, expect=1)
    init = by(report, "collectives")[0]
    assert init["status"] == "fail" and "process-group creation failed on worker1" in init["summary"]
    assert "ss_family" in init["summary"] and "likely cause: address-family on worker1" in init["summary"]
    assert init["fix"].startswith("export GLOO_SOCKET_IFNAME=eth0")
    assert all(r["seconds"] < 5 for r in init["details"]["init"])           # fast: no timeout
    assert "the matrix was measured that way" in init["summary"]
    # The pinned run still measures the matrix: the get_future gap shows (with the passes, no code given).
    gap = results_by_op(report)["reduce_scatter_tensor"]
    assert gap["status"] == "pass" and "Work::getFuture not implemented" in gap["summary"]
    assert seconds < 45
    assert settled(clean_lab, before) == before


def test_a_firewall_is_reported_at_the_bound_not_waited_on(clean_lab):
    # The collectives check alone: no network probe has found the block first (with one, the job
    # is not started there: test_probes_network.py), so the job meets it.
    clean_lab.add_fault("firewall@worker1")
    before = snapshot(clean_lab)
    _, report, seconds = timed(clean_lab, "--only", "collectives", expect=1)
    [result] = by(report, "collectives")
    assert result["status"] == "fail" and "did not finish within 15 s" in result["summary"]
    assert result["summary"].endswith(
        "; likely cause: firewall on worker1: worker1's nftables drops some new inbound connections (1 drop rule(s)); "
        "Gloo listens on ephemeral ports (32768-60999) there (see ephemeral-ports)"), result["summary"]
    assert result["fix"].startswith("on worker1: sudo ufw allow from ") and result["fix"].endswith(
        " proto tcp to any port 32768:60999"), result["fix"]
    # Gloo alone would retry the dropped connection for 5 x its timeout; the probe stops at its bound.
    assert seconds < 45
    assert settled(clean_lab, before) == before


def test_a_held_master_port_skips_with_a_pointer_to_master_port(clean_lab):
    clean_lab.add_fault("port-busy@master")
    _, report, _ = timed(clean_lab, "--only", "master-port,collectives", expect=1)
    result = by(report, "collectives")[0]
    assert result["status"] == "skip" and "see master-port" in result["summary"]


def test_sixteen_ranks_return_no_false_wrong_result(clean_lab):
    # Issue 10: at 16 ranks Gloo's bfloat16 sums round past a fixed 1% ("got 380.0, expected
    # 376.0"), a false failure. 2 nodes x 8 processes give the same world size and the same Gloo
    # arithmetic as 16 nodes x 1 at half the cost on this box (measured: about 20 s against 40 s;
    # 16 nodes once missed the 15 s creation bound when other work loaded the cores).
    before = snapshot(clean_lab)
    _, report, seconds = timed(clean_lab, *ONLY, "--nproc-per-node", "8", expect=0)
    results = by(report, "collectives")
    # Gloo's own gaps, kept with the passes (no code given), and nothing wrong.
    assert {r["status"] for r in results} == {"pass"} and len(results) == 5
    details = results[0]["details"]
    assert details["world"] == 16 and details["nodes"] == ["master", "worker1"]
    cells = {(op, mode, dtype): cell for op, modes in details["matrix"].items()
             for mode, dtypes in modes.items() for dtype, cell in dtypes.items()}
    assert not [case for case, cell in cells.items() if cell.startswith("wrong")]
    assert all(cells[op, mode, "bfloat16"] == "ok" for op in ("all_reduce_sum", "all_reduce_avg",
                                                              "reduce_scatter_tensor", "reduce_scatter")
               for mode in ("sync", "async_wait"))
    assert seconds < 60
    assert settled(clean_lab, before) == before
