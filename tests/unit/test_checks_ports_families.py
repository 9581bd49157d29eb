"""ephemeral-ports in every address family a node's ranks bind (issue 26), on recorded real probe
data of the lab: every hostname resolves to the node's IPv6 on eth0 (ipv6-host on both nodes),
so a torchrun started without a pin binds IPv6 and one pinned to eth0 (as --launch pins it)
IPv4; worker1's firewall drops one family only."""

import copy

from ddp_preflight.preflight.checks import run_checks
from ddp_preflight.preflight.model import NodeFacts, Options, Status
from ddp_preflight.preflight.probes.network import unpinned_address
from ddp_preflight.preflight.probes.network_seen import NetworkSeen
from ddp_preflight.rules.training_env import Setting, TrainingEnv

from .test_checks_ports import PORT_CHECKS, ctx_of, load, results

W1_V4, W1_V6 = "10.213.0.11", "fd64:6470:213::11"


def test_a_firewall_for_ipv6_alone_fails_where_unpinned_ranks_bind_with_the_ip6_rule():
    got = results(load("lab_probe_ipv6_firewall"))
    assert {k: r.status for k, r in got.items()} == {
        ("master-reachable", "worker1"): Status.PASS,
        ("ephemeral-ports", "master"): Status.PASS, ("ephemeral-ports", "worker1"): Status.FAIL}
    worker = got[("ephemeral-ports", "worker1")]
    assert worker.summary == (
        f"new connections to worker1's ephemeral ports at {W1_V6} (IPv6: where its ranks bind unpinned, as its "
        "hostname resolves) are blocked from master: silently dropped (a firewall). worker1 has the lower address, "
        "so it listens and master connects: Gloo's process-group creation hangs, then fails with 'Connect timeout'. "
        f"Pinned, its ranks bind IPv4 {W1_V4}, where the same connections open")
    assert worker.fix == (
        "on worker1: sudo ufw allow from fd64:6470:213::/64 proto tcp to any port 32768:60999   # or nftables: sudo "
        "nft insert rule inet ddp_lab_firewall input ip6 saddr fd64:6470:213::/64 tcp dport 32768-60999 accept")
    assert worker.details["unpinned"] is True and worker.details["address"] == W1_V6
    master = got[("ephemeral-ports", "master")]
    assert master.summary == (
        "accepts new connections on its ephemeral ports (32768-60999) from worker1, at IPv4 10.213.0.200 (where its "
        "ranks bind once their interface is pinned) and at IPv6 fd64:6470:213::200 (where they bind unpinned)")


def test_a_firewall_for_ipv4_alone_warns_naming_the_pin_as_what_meets_it():
    got = results(load("lab_probe_ipv4_firewall"))
    assert {k: r.status for k, r in got.items()} == {
        ("master-reachable", "worker1"): Status.PASS,
        ("ephemeral-ports", "master"): Status.PASS, ("ephemeral-ports", "worker1"): Status.WARN}
    worker = got[("ephemeral-ports", "worker1")]
    assert worker.summary.startswith(f"new connections to worker1's ephemeral ports at {W1_V4} (IPv4: where its "
                                     "ranks bind once their interface is pinned) are blocked from master: silently "
                                     "dropped (a firewall).")
    assert worker.summary.endswith(f"A torchrun started without GLOO_SOCKET_IFNAME is not stopped: unpinned, its "
                                   f"ranks bind IPv6 {W1_V6}, where the same connections open; pinning their "
                                   "interface (as --launch does, or a fix that sets it) meets this block")
    assert worker.fix.startswith("on worker1: sudo ufw allow from 10.213.0.0/24 proto tcp to any port 32768:60999")


def test_both_families_blocked_are_two_results_each_with_its_own_rule():
    # Derived from the IPv6 recording: the pinned IPv4 dials into worker1 dropped as well.
    art = load("lab_probe_ipv6_firewall")
    probes = copy.deepcopy(art["probes"])
    for pair in probes["network"]["pairs"]:
        if pair["dst"] == "worker1" and not pair.get("unpinned") and pair["kind"] != "master":
            pair["outcome"] = "filtered"
    ctx_results = [r for r in run_checks(ctx_of(art, probes), PORT_CHECKS)
                   if (r.check, r.node) == ("ephemeral-ports", "worker1")]
    assert [(r.status, r.details["address"]) for r in ctx_results] == [(Status.FAIL, W1_V4), (Status.FAIL, W1_V6)]
    assert [" ip saddr 10.213.0.0/24 " in ctx_results[0].fix, " ip6 saddr fd64:6470:213::/64 " in ctx_results[1].fix] \
        == [True, True]


def test_the_pinned_paths_evidence_never_holds_the_other_familys_dials():
    seen = NetworkSeen.from_json(load("lab_probe_ipv6_firewall")["probes"]["network"])
    assert {d.sent["address"] for d in seen.dials if d.dst == "worker1"} == {W1_V4}
    assert {d.sent["address"] for d in seen.unpinned_dials if d.dst == "worker1"} == {W1_V6}
    assert seen.blocked({"master", "worker1"}) == []     # what a failed job's likely cause reads: pinned only


def test_the_other_family_is_probed_only_where_unpinned_ranks_bind_it_on_the_pinned_interface():
    art = load("lab_probe_ipv6_firewall")
    worker = NodeFacts("worker1", art["nodes"][1]["facts"], None, None)
    assert unpinned_address(worker, Options(master_addr=art["master_addr"])) == W1_V6
    assert unpinned_address(worker, Options(master_addr=art["master_addr"], launch=True)) is None   # --launch pins
    pinned = TrainingEnv((Setting("GLOO_SOCKET_IFNAME", "eth0", None, 0),))
    assert unpinned_address(worker, Options(master_addr=art["master_addr"], env=pinned)) is None
    assert unpinned_address(worker, Options(master_addr=art["master_addr"], backend="nccl")) is None
    vpn = load("lab_probe_two_faults")   # unpinned on the VPN's interface: address-family's finding, not probed
    assert unpinned_address(NodeFacts("worker1", vpn["nodes"][1]["facts"], None, None),
                            Options(master_addr=vpn["master_addr"])) is None
    clean = load("lab_probe_clean")      # hostnames resolve to IPv4: one family, one listener
    assert unpinned_address(NodeFacts("worker1", clean["nodes"][1]["facts"], None, None),
                            Options(master_addr=clean["master_addr"])) is None
