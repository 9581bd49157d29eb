"""Real torch.distributed (Gloo) across lab nodes, launched over the lab's sshd."""

from .ddp import run_job


def test_two_node_all_reduce_passes_on_a_clean_lab(clean_lab):
    outcomes = run_job(clean_lab, ["master", "worker1"], torchrun=True)
    for outcome in outcomes:
        assert outcome.returncode == 0, outcome.output
        assert outcome.result["ok"] and outcome.result["world"] == 2
        assert outcome.result["sum"] == [3.0, 3.0, 3.0, 3.0]      # 1 + 2 from the two ranks
    assert {o.result["host"] for o in outcomes} == {"master", "worker1"}


def test_vpn_ipv6_fails_with_gloos_address_family_error(clean_lab):
    clean_lab.add_fault("vpn-ipv6@worker1")
    outcomes = run_job(clean_lab, ["master", "worker1"], pg_timeout=10)
    assert all(o.returncode != 0 for o in outcomes)
    errors = " ".join(o.result.get("error", "") for o in outcomes)
    # The seed's exact enforce failure (10 = AF_INET6, 2 = AF_INET).
    assert "ss1.ss_family == ss2.ss_family" in errors
    assert "10 vs 2" in errors or "2 vs 10" in errors


def test_firewall_stalls_process_group_creation_until_the_timeout(clean_lab):
    clean_lab.add_fault("firewall@worker1")
    outcomes = run_job(clean_lab, ["master", "worker1"], pg_timeout=3, port=29501)
    assert all(o.returncode != 0 for o in outcomes), [o.output for o in outcomes]
    # Not refused at once: the connection attempts are silently dropped until the timeout.
    assert all(o.result["seconds"] >= 3 for o in outcomes)
    errors = " ".join(o.result.get("error", "") for o in outcomes)
    assert "Connect timeout" in errors or "timed out" in errors.lower(), errors
