"""The network probe over the lab: firewalls caught on the right node and in the right direction."""

from __future__ import annotations

import re
import secrets

from ddp_preflight.lab import Lab

from .test_lab_faults import connect_outcome
from .test_preflight_lab import by, preflight

ONLY = ("--only", "master-reachable,ephemeral-ports")


def listening(lab, node):
    return sorted(lab.exec(node, ["ss", "-Htln"]).stdout.split("\n"))


def test_a_clean_lab_passes_both_directions_and_leaves_nothing_behind(clean_lab):
    before = {n.name: (sorted(clean_lab.processes(n.name)), listening(clean_lab, n.name)) for n in clean_lab.nodes}
    _, report = preflight(clean_lab, *ONLY, expect=0)
    assert statuses_of(report) == {("master-reachable", "worker1"): "pass", ("ephemeral-ports", "master"): "pass",
                                   ("ephemeral-ports", "worker1"): "pass"}
    pairs = by(report, "ephemeral-ports", "worker1")["details"]["pairs"]
    assert {p["kind"]: p["outcome"] for p in pairs} == {"listener": "open", "closed": "refused"}
    after = {n.name: (sorted(clean_lab.processes(n.name)), listening(clean_lab, n.name)) for n in clean_lab.nodes}
    assert after == before


def statuses_of(report):
    return {(r["check"], r["node"]): r["status"] for r in report["results"]}


def test_a_firewall_on_the_worker_fails_there_in_glooss_direction(clean_lab):
    clean_lab.add_fault("firewall@worker1")
    _, report = preflight(clean_lab, *ONLY, expect=1)
    result = by(report, "ephemeral-ports", "worker1")
    assert result["status"] == "fail"
    assert "from master: silently dropped" in result["summary"] and "Connect timeout" in result["summary"]
    assert "ufw allow from" in result["fix"] and "32768:60999" in result["fix"] and "nft insert rule" in result["fix"]
    assert by(report, "ephemeral-ports", "master")["status"] == "pass"       # the other direction is open
    assert by(report, "master-reachable", "worker1")["status"] == "pass"     # 29500 is not ephemeral


def test_a_firewall_on_the_master_is_caught_in_the_other_direction(clean_lab):
    # The master has the higher address: Gloo never listens there for a master-worker pair,
    # so this is a warning, but the blocked direction is still named.
    clean_lab.add_fault("firewall@master")
    _, report = preflight(clean_lab, *ONLY, expect=0)
    result = by(report, "ephemeral-ports", "master")
    assert result["status"] == "warn" and "from worker1: silently dropped" in result["summary"]
    assert by(report, "ephemeral-ports", "worker1")["status"] == "pass"


def test_a_dropped_master_port_fails_master_reachable(clean_lab):
    rule = ["nft", "add", "table", "inet", "probe_test"], \
           ["nft", "add", "chain", "inet", "probe_test", "input", "{ type filter hook input priority 0 ; }"], \
           ["nft", "add", "rule", "inet", "probe_test", "input", "tcp", "dport", "29500", "drop"]
    try:
        for argv in rule:
            clean_lab.exec("master", argv, check=True)
        _, report = preflight(clean_lab, *ONLY, expect=1)
        result = by(report, "master-reachable", "worker1")
        assert result["status"] == "fail" and "silently dropped" in result["summary"] and ":29500" in result["summary"]
    finally:
        clean_lab.exec("master", ["nft", "delete", "table", "inet", "probe_test"])


def test_an_ipv6_only_bind_is_address_familys_finding_and_the_pinned_address_is_probed(clean_lab):
    # Gloo would bind the VPN's IPv6 address unpinned: address-family says so, with the pin. The
    # probe listens where the ranks will bind once pinned (eth0's IPv4), which is open.
    clean_lab.add_fault("vpn-ipv6@worker1")
    _, report = preflight(clean_lab, "--only", "address-family,master-reachable,ephemeral-ports", expect=1)
    assert failing(report) == {("address-family", "worker1")}
    ports = by(report, "ephemeral-ports", "worker1")
    assert ports["status"] == "pass" and ports["details"]["address"] == clean_lab.node("worker1").ipv4


def test_a_stranger_without_the_token_is_turned_away_and_counted(clean_lab):
    # Connect to the probe's listener from outside the run while it is up: it must not answer OK.
    import sys
    import threading
    import time
    seen = {}

    def stranger():
        # Watch worker1's listening ports until the probe's appear, then knock without the token.
        deadline = time.monotonic() + 20
        base = set(listening(clean_lab, "worker1"))
        while time.monotonic() < deadline:
            worker_ip = clean_lab.node("worker1").ipv4
            new = [line for line in listening(clean_lab, "worker1") if line and line not in base and worker_ip in line]
            if new:
                port = int(new[0].split()[3].rsplit(":", 1)[1])
                code = ("import socket; s=socket.create_connection(('%s', %d), timeout=3); s.sendall(b'x'*32); "
                        "print(repr(s.recv(2)))" % (clean_lab.node("worker1").ipv4, port))
                seen["answer"] = clean_lab.exec("master", [sys.executable, "-c", code]).stdout.strip()
                return
            time.sleep(0.05)

    thread = threading.Thread(target=stranger)
    thread.start()
    _, report = preflight(clean_lab, *ONLY)
    thread.join()
    assert seen.get("answer") == "b''"                  # closed without the OK
    assert by(report, "ephemeral-ports", "worker1")["details"]["turned_away"] >= 1


def results_of(report):
    """Every result as (check, node, status), in order: a node can have two ephemeral-ports results."""
    return sorted((r["check"], r["node"], r["status"]) for r in report["results"])


def failing(report):
    return {(r["check"], r["node"]) for r in report["results"] if r["status"] in ("fail", "error")}


def test_with_two_ranks_per_node_every_node_to_itself_is_probed_and_passes(clean_lab):
    _, report = preflight(clean_lab, *ONLY, "--nproc-per-node", "2", expect=0)
    assert results_of(report) == [("ephemeral-ports", "master", "pass"), ("ephemeral-ports", "master", "pass"),
                                  ("ephemeral-ports", "worker1", "pass"), ("ephemeral-ports", "worker1", "pass"),
                                  ("master-reachable", "worker1", "pass")]
    own = [r for r in report["results"] if r["details"].get("path") == "self"]
    assert {r["node"] for r in own} == {"master", "worker1"}
    for r in own:
        assert {(p["src"], p["dst"], p["kind"], p["outcome"]) for p in r["details"]["pairs"]} == {
            (r["node"], r["node"], "listener", "open"), (r["node"], r["node"], "closed", "refused")}


def test_a_firewall_without_a_loopback_exemption_fails_the_master_to_itself(clean_lab):
    # The master has the lab's highest address: Gloo never listens there for another node, so
    # the drop between nodes is a warning; its two ranks still dial each other there, over lo.
    clean_lab.add_fault("firewall-self@master")
    _, report = preflight(clean_lab, *ONLY, "--nproc-per-node", "2", expect=1)
    assert failing(report) == {("ephemeral-ports", "master")}
    assert results_of(report) == [("ephemeral-ports", "master", "fail"), ("ephemeral-ports", "master", "warn"),
                                  ("ephemeral-ports", "worker1", "pass"), ("ephemeral-ports", "worker1", "pass"),
                                  ("master-reachable", "worker1", "pass")]
    result = next(r for r in report["results"] if r["status"] == "fail")
    ip = clean_lab.node("master").ipv4
    low, high = by(report, "ephemeral-ports", "worker1")["details"]["range"]
    assert result["summary"] == (
        f"master -> itself at {ip}:{low}-{high}: new connections are silently dropped (a firewall); its 2 ranks "
        "connect to each other there, so Gloo's process-group creation hangs, then fails in connectFullMesh "
        "('Connect timeout'). The path never leaves master: its own firewall drops it")
    assert result["fix"].startswith("on master: sudo nft insert rule inet filter input iif lo accept   #")
    # The fix, pasted as printed (the lab's ruleset is the Debian-named `inet filter`), opens the path.
    command = result["fix"].removeprefix("on master: sudo ").split("   #")[0].split()
    clean_lab.exec("master", command, check=True)
    _, fixed = preflight(clean_lab, *ONLY, "--nproc-per-node", "2", expect=0)
    assert failing(fixed) == set()


def test_with_one_rank_per_node_the_node_to_itself_is_not_probed(clean_lab):
    clean_lab.add_fault("firewall-self@master")
    _, report = preflight(clean_lab, *ONLY, expect=0)
    assert results_of(report) == [("ephemeral-ports", "master", "warn"), ("ephemeral-ports", "worker1", "pass"),
                                  ("master-reachable", "worker1", "pass")]


def test_one_node_with_two_ranks_probes_the_node_to_itself(clean_lab):
    clean_lab.add_fault("firewall-self@master")
    _, report = preflight(clean_lab, *ONLY, "--nproc-per-node", "2", hosts=("master",), expect=1)
    assert results_of(report) == [("ephemeral-ports", "master", "fail"), ("master-reachable", "master", "skip")]
    assert by(report, "ephemeral-ports", "master")["summary"].startswith(
        f"master -> itself at {clean_lab.node('master').ipv4}:")


def test_a_two_by_two_torchrun_is_not_started_over_a_nodes_own_blocked_port_and_says_which(clean_lab):
    # The collectives probe is a real torchrun, 2 nodes x 2 ranks over Gloo: rank 1 on the master
    # could not dial rank 0 on the master's own address. It waited out its 15 s bound there, then
    # failed with ephemeral-ports' cause and fix a second time (issue 26): it is not started, and
    # says which path stops it; the fix is ephemeral-ports' alone.
    clean_lab.add_fault("firewall-self@master")
    _, report = preflight(clean_lab, "--only", "ephemeral-ports,collectives", "--nproc-per-node", "2", expect=1)
    assert failing(report) == {("ephemeral-ports", "master")}
    collectives = next(r for r in report["results"] if r["check"] == "collectives")
    assert (collectives["status"], collectives["fix"]) == ("skip", None), collectives
    master = re.escape(clean_lab.node("master").ipv4)
    assert re.fullmatch(rf"not probed: (master -> its own|worker1 -> master's) port \d+ on {master} is blocked "
                        r"\(filtered\), so the job's ranks could not connect \(see ephemeral-ports\)",
                        collectives["summary"]), collectives["summary"]


def test_two_faults_on_one_node_are_two_results_each_with_its_own_fix(clean_lab):
    # An IPv6-only VPN address that Gloo would bind, and a firewall on the LAN address it binds
    # once pinned: the first must not hide the second.
    clean_lab.add_fault("vpn-ipv6@worker1")
    clean_lab.add_fault("firewall@worker1")
    _, report = preflight(clean_lab, "--only", "address-family,interface-choice,master-reachable,ephemeral-ports",
                          expect=1)
    assert failing(report) == {("address-family", "worker1"), ("ephemeral-ports", "worker1")}
    family, ports = by(report, "address-family", "worker1"), by(report, "ephemeral-ports", "worker1")
    assert family["fix"].startswith("export GLOO_SOCKET_IFNAME=eth0")
    assert ports["details"]["address"] == clean_lab.node("worker1").ipv4
    assert "from master: silently dropped" in ports["summary"]
    assert ports["fix"].startswith("on worker1: sudo ufw allow from ") and "32768:60999" in ports["fix"]
    # The warning is interface-choice's view of the same bind, with the same fix as address-family.
    assert by(report, "interface-choice", "worker1")["status"] == "warn"


def test_a_dead_route_is_named_on_its_node_once_and_its_fix_lets_a_real_job_through(clean_lab):
    # Issue 26: worker1's host route to the master through a link with no carrier was a firewall on
    # the master (with an nft command that failed there), "pin eth1", and ephemeral ports fixed on
    # the master. The route is the one cause, named on worker1, with the one command that removes it.
    clean_lab.add_fault("dead-route@worker1")
    master = clean_lab.node("master").ipv4
    _, report = preflight(clean_lab, "--only", "master-reachable,interface-choice,ephemeral-ports", expect=1)
    assert sorted((r["check"], r["node"], r["status"]) for r in report["results"]) == [
        ("ephemeral-ports", "master", "warn"), ("ephemeral-ports", "worker1", "fail"),
        ("interface-choice", "master", "pass"), ("interface-choice", "worker1", "fail"),
        ("master-reachable", "worker1", "fail")]
    fix = f"on worker1: sudo ip route del {master} dev eth1   # or bring eth1 up"
    named = [r for r in report["results"] if r["status"] != "pass"]
    assert {r["fix"] for r in named} == {fix}, named
    assert all(f"worker1's route to {master}" in r["summary"] or f"worker1's route to the master ({master})"
               in r["summary"] for r in named), named
    assert "goes out eth1, which has no carrier" in by(report, "master-reachable", "worker1")["summary"]
    # Issue 38: path-mtu said the paths were "not measured" (or the probe's "error") with no fix:
    # the same route, named on worker1 once for both directions, with the same fix.
    _, mtu = preflight(clean_lab, "--only", "path-mtu", expect=1)
    assert [(r["check"], r["node"], r["status"], r["fix"]) for r in mtu["results"]] == [
        ("path-mtu", "worker1", "fail", fix)], mtu["results"]
    assert mtu["results"][0]["summary"] == (
        f"master -> worker1, worker1 -> master: not measured: worker1's route to {master} goes out eth1, which has no "
        "carrier (the kernel marks the route linkdown): what it sends the master (its probes and its answers) goes "
        "nowhere")
    # The fix as printed, on worker1; then a real 2 x 2 Gloo job (the collectives probe) runs.
    clean_lab.exec("worker1", fix.removeprefix("on worker1: sudo ").split("   #")[0].split(), check=True)
    _, after = preflight(clean_lab, "--only", "master-reachable,interface-choice,ephemeral-ports,collectives",
                         "--nproc-per-node", "2", expect=0)
    assert {r["status"] for r in after["results"]} == {"pass"}, [r for r in after["results"] if r["status"] != "pass"]


def test_a_strict_rp_filter_on_an_asymmetric_path_is_named_on_its_node_once_and_its_fix_lets_a_real_job_through(
        clean_lab):
    # Issue 26: worker1 reaches the master over a direct link (eth1) while the master reaches it on
    # the LAN (eth0), and its strict reverse-path filter drops all the master sends there. The probes
    # said "filtered" and blamed a firewall on the master. The filter on the asymmetric path is the
    # one cause, named on worker1, with one fix that makes the path symmetric.
    filters = ["sysctl", "-n", "net.ipv4.conf.all.rp_filter", "net.ipv4.conf.eth0.rp_filter"]
    before = clean_lab.exec("worker1", filters, check=True).stdout
    clean_lab.add_fault("rp-filter@worker1")
    master, worker = clean_lab.node("master").ipv4, clean_lab.node("worker1").ipv4
    assert connect_outcome(clean_lab, "master", worker, 22) == "filtered"          # a real connection, to sshd
    _, report = preflight(clean_lab, "--only", "master-reachable,interface-choice,ephemeral-ports", expect=1)
    assert sorted((r["check"], r["node"], r["status"]) for r in report["results"]) == [
        ("ephemeral-ports", "master", "warn"), ("ephemeral-ports", "worker1", "fail"),
        ("interface-choice", "master", "pass"), ("interface-choice", "worker1", "fail"),
        ("master-reachable", "worker1", "fail")]
    loose = "sudo sysctl -w net.ipv4.conf.eth0.rp_filter=2"
    fix = (f"on worker1: sudo ip route del {master} dev eth1   # the master is then reached via eth0, where its "
           f"packets arrive; or keep the route, with eth0 in loose mode: {loose}")
    named = [r for r in report["results"] if r["status"] != "pass"]
    assert {r["fix"] for r in named} == {fix}, named
    why = (f"worker1's route to {master} goes out eth1, but what the master sends to {worker} arrives on eth0, whose "
           "reverse-path filter is strict (rp_filter 1): worker1 drops it")
    assert all(why in r["summary"] for r in named), named
    assert not any("firewall" in r["summary"] or "nft" in r["fix"] for r in named), named
    # The fix as printed, on worker1; then a real 2 x 2 Gloo job (the collectives probe) runs.
    clean_lab.exec("worker1", fix.removeprefix("on worker1: sudo ").split("   #")[0].split(), check=True)
    _, after = preflight(clean_lab, "--only", "master-reachable,interface-choice,ephemeral-ports,collectives",
                         "--nproc-per-node", "2", expect=0)
    assert {r["status"] for r in after["results"]} == {"pass"}, [r for r in after["results"] if r["status"] != "pass"]
    # The other way the fix offers, the route kept: loose mode lets the master's packets in on eth0
    # while worker1 answers over eth1. And clearing the fault leaves worker1 as it was.
    clean_lab.clear_faults()
    clean_lab.add_fault("rp-filter@worker1")
    clean_lab.exec("worker1", loose.removeprefix("sudo ").split(), check=True)
    assert connect_outcome(clean_lab, "master", worker, 22) == "open"
    assert connect_outcome(clean_lab, "worker1", master, 22) == "open"
    clean_lab.clear_faults()
    assert clean_lab.exec("worker1", ["ip", "-o", "link", "show", "eth1"]).returncode != 0
    assert clean_lab.exec("master", ["ip", "-o", "link", "show", "to-worker1"]).returncode != 0
    assert clean_lab.exec("worker1", filters, check=True).stdout == before


def test_every_family_a_rank_binds_is_probed_each_block_named_with_its_own_rule(clean_lab):
    # Issue 26: with every hostname resolving to IPv6, a torchrun started without a pin binds IPv6,
    # --launch's pin IPv4 (eth0's first address). The probe tried IPv4 only: a firewall written for
    # IPv6 alone was never named, and one for IPv4 alone failed a run that works unpinned.
    from .ddp import run_job
    clean_lab.add_fault("ipv6-host@master")
    clean_lab.add_fault("ipv6-host@worker1")
    w1 = clean_lab.node("worker1")
    # IPv4 alone blocked: a warning that names the pin as what meets it; the run as started trains.
    clean_lab.add_fault("firewall@worker1:ipv4")
    _, report = preflight(clean_lab, *ONLY, expect=0)
    assert results_of(report) == [("ephemeral-ports", "master", "pass"), ("ephemeral-ports", "worker1", "warn"),
                                  ("master-reachable", "worker1", "pass")]
    warn = by(report, "ephemeral-ports", "worker1")
    assert warn["summary"] == (
        f"new connections to worker1's ephemeral ports at {w1.ipv4} (IPv4: where its ranks bind once their interface "
        "is pinned) are blocked from master: silently dropped (a firewall). worker1 has the lower address, so it "
        "listens and master connects: Gloo's process-group creation hangs, then fails with 'Connect timeout'. "
        f"A torchrun started without GLOO_SOCKET_IFNAME is not stopped: unpinned, its ranks bind IPv6 {w1.ipv6}, "
        "where the same connections open; pinning their interface (as --launch does, or a fix that sets it) meets "
        "this block")
    outcomes = run_job(clean_lab, ["master", "worker1"], port=29573, pg_timeout=15)
    assert [(o.returncode, o.result.get("ok")) for o in outcomes] == [(0, True), (0, True)], \
        [o.output[-1500:] for o in outcomes]
    # IPv6 alone blocked: a failure, with the ip6 rule; the unpinned run really fails, and the rule,
    # pasted as printed, lets it train.
    clean_lab.clear_faults(["firewall@worker1:ipv4"])
    clean_lab.add_fault("firewall@worker1:ipv6")
    _, report = preflight(clean_lab, *ONLY, expect=1)
    assert results_of(report) == [("ephemeral-ports", "master", "pass"), ("ephemeral-ports", "worker1", "fail"),
                                  ("master-reachable", "worker1", "pass")]
    fail = by(report, "ephemeral-ports", "worker1")
    assert fail["summary"] == (
        f"new connections to worker1's ephemeral ports at {w1.ipv6} (IPv6: where its ranks bind unpinned, as its "
        "hostname resolves) are blocked from master: silently dropped (a firewall). worker1 has the lower address, "
        "so it listens and master connects: Gloo's process-group creation hangs, then fails with 'Connect timeout'. "
        f"Pinned, its ranks bind IPv4 {w1.ipv4}, where the same connections open")
    low, high = fail["details"]["range"]
    subnet = w1.ipv6.rsplit("::", 1)[0] + "::/64"
    assert fail["fix"] == (
        f"on worker1: sudo ufw allow from {subnet} proto tcp to any port {low}:{high}   # or nftables: sudo nft "
        f"insert rule inet ddp_lab_firewall input ip6 saddr {subnet} tcp dport {low}-{high} accept")
    outcomes = run_job(clean_lab, ["master", "worker1"], port=29574, pg_timeout=8)
    assert [o.result.get("ok") for o in outcomes] != [True, True], [o.output[-1500:] for o in outcomes]
    # The collectives job is not started as the nodes are set up (its ranks could not connect):
    # it runs pinned alone, and says why.
    _, measured = preflight(clean_lab, "--only", "collectives,ephemeral-ports", expect=1)
    collectives = [r for r in measured["results"] if r["check"] == "collectives"]
    assert {r["status"] for r in collectives} == {"pass"}, collectives
    under = (r" \(measured with GLOO_SOCKET_IFNAME=eth0 on every node, as preflight chose; as the nodes are set up, "
             rf"master -> worker1's port \d+ on {re.escape(w1.ipv6)} is blocked \(filtered\), so the job's ranks "
             r"could not connect \(see ephemeral-ports\)\)")
    # The group formed pinned (a matrix was measured): each result (here, the less common operations
    # Gloo fails, kept with the passes) says how it was measured.
    assert collectives and all(re.search(under, r["summary"]) for r in collectives), collectives
    clean_lab.exec("worker1", fail["fix"].split("or nftables: sudo ")[1].split(), check=True)
    _, fixed = preflight(clean_lab, *ONLY, expect=0)
    assert failing(fixed) == set() and [r["status"] for r in fixed["results"]] == ["pass"] * 3, fixed["results"]
    outcomes = run_job(clean_lab, ["master", "worker1"], port=29575, pg_timeout=15)
    assert [(o.returncode, o.result.get("ok")) for o in outcomes] == [(0, True), (0, True)], \
        [o.output[-1500:] for o in outcomes]


def test_a_dead_route_or_a_strict_rp_filter_between_two_workers_is_named_on_its_node_once_and_its_fix_clears_the_path():
    # Issue 26: a path between two workers lost to one's own route (worker1's host route to worker2
    # through a link with no carrier) was a firewall, with ufw fixes on both. The route is the one
    # cause, named on worker1, with the one command that removes it; the master's paths pass.
    name = "r" + secrets.token_hex(3)
    lab, _ = Lab.up(name, nodes=3, faults=["dead-route@worker1:worker2"])
    try:
        hosts = ("master", "worker1", "worker2")
        _, report = preflight(lab, *ONLY, hosts=hosts, expect=1)
        assert sorted((r["check"], r["node"], r["status"]) for r in report["results"]) == [
            ("ephemeral-ports", "master", "pass"), ("ephemeral-ports", "worker1", "fail"),
            ("ephemeral-ports", "worker2", "warn"), ("master-reachable", "worker1", "pass"),
            ("master-reachable", "worker2", "pass")]
        fix = f"on worker1: sudo ip route del {lab.node('worker2').ipv4} dev eth1   # or bring eth1 up"
        named = [r for r in report["results"] if r["status"] != "pass"]
        assert {r["fix"] for r in named} == {fix}, named
        assert all("worker1's route to" in r["summary"] and "no carrier" in r["summary"] for r in named), named
        # The fix as printed, on worker1: every path passes.
        lab.exec("worker1", fix.removeprefix("on worker1: sudo ").split("   #")[0].split(), check=True)
        _, after = preflight(lab, *ONLY, hosts=hosts, expect=0)
        assert {r["status"] for r in after["results"]} == {"pass"}, [r for r in after["results"] if r["status"] != "pass"]
        # On the same lab: a direct link from worker1 to worker2 with a host route through it, and a
        # strict reverse-path filter on worker1, which drops all worker2 sends it on eth0.
        lab.clear_faults()
        lab.add_fault("rp-filter@worker1:worker2")
        w1, w2 = lab.node("worker1").ipv4, lab.node("worker2").ipv4
        _, report = preflight(lab, *ONLY, hosts=hosts, expect=1)
        assert sorted((r["check"], r["node"], r["status"]) for r in report["results"]) == [
            ("ephemeral-ports", "master", "pass"), ("ephemeral-ports", "worker1", "fail"),
            ("ephemeral-ports", "worker2", "warn"), ("master-reachable", "worker1", "pass"),
            ("master-reachable", "worker2", "pass")]
        fix = (f"on worker1: sudo ip route del {w2} dev eth1   # worker2 is then reached via eth0, where its packets "
               "arrive; or keep the route, with eth0 in loose mode: sudo sysctl -w net.ipv4.conf.eth0.rp_filter=2")
        named = [r for r in report["results"] if r["status"] != "pass"]
        assert {r["fix"] for r in named} == {fix}, named
        assert all(f"worker1's route to {w2} goes out eth1, but what worker2 sends to {w1} arrives on eth0, whose "
                   "reverse-path filter is strict (rp_filter 1): worker1 drops it" in r["summary"] for r in named), named
        lab.exec("worker1", fix.removeprefix("on worker1: sudo ").split("   #")[0].split(), check=True)
        _, after = preflight(lab, *ONLY, hosts=hosts, expect=0)
        assert {r["status"] for r in after["results"]} == {"pass"}, [r for r in after["results"] if r["status"] != "pass"]
    finally:
        Lab.down(name)


def test_one_direction_blocked_that_gloo_never_takes_is_a_warning_and_the_real_jobs_run(clean_lab):
    # Issue 38: the master (the higher address) drops new connections into its ephemeral ports;
    # it may still connect to worker1, the way Gloo joins them. ephemeral-ports warns; the
    # collectives and bandwidth jobs (real 2 x 1 Gloo runs) were skipped with a false "could not
    # connect": now they run, and pass.
    clean_lab.add_fault("firewall@master")
    _, report = preflight(clean_lab, "--only", "ephemeral-ports,collectives,bandwidth", expect=0)
    assert statuses_of(report) == {("ephemeral-ports", "master"): "warn", ("ephemeral-ports", "worker1"): "pass",
                                   ("collectives", None): "pass", ("bandwidth", None): "pass"}, report["results"]
    assert "from worker1: silently dropped" in by(report, "ephemeral-ports", "master")["summary"]


def test_a_stale_hosts_line_is_the_name_on_its_node_and_its_fix_lets_a_real_job_through(clean_lab):
    # Issue 38: worker1's /etc/hosts maps `master` to an address where nothing answers. It was
    # "silently dropped (a firewall)" with no fix; the cause is the name, on worker1: what it
    # resolves to there, the line it comes from, and the command that changes that line.
    clean_lab.add_fault("stale-hosts@worker1")
    master = clean_lab.node("master").ipv4
    stale = master.rsplit(".", 1)[0] + ".250"
    lines = clean_lab.exec("worker1", ["cat", "/etc/hosts"], check=True).stdout.splitlines()
    number = lines.index(f"{stale}\tmaster") + 1
    checks = "master-reachable,interface-choice,ephemeral-ports,address-family"
    # The workers dial the master's name, as a torchrun given --master-addr master does.
    _, report = preflight(clean_lab, "--only", checks, "--master-addr", "master", expect=1)
    assert sorted((r["check"], r["node"], r["status"]) for r in report["results"] if r["status"] != "pass") == [
        ("master-reachable", "worker1", "fail")], report["results"]
    result = by(report, "master-reachable", "worker1")
    assert result["summary"] == (
        f"cannot reach the master at master:29500: the name master resolves on worker1 to {stale} (/etc/hosts line "
        f"{number}: `{stale}\tmaster`), which is none of the master's addresses (it listens at {master}); "
        "rendezvous will time out")
    script = f'h=$(sed "{number}s/^[^[:space:]]*/{master}/" /etc/hosts) && printf "%s\\n" "$h" > /etc/hosts'
    assert result["fix"] == (f"on worker1: sudo sh -c '{script}'   # line {number} of worker1's /etc/hosts then "
                             f"maps master to {master}, the master's address")
    # The fix as printed, on worker1 (its /etc/hosts is a mount there, as in a container); then a
    # real 2 x 2 Gloo job (the collectives probe) runs.
    command = result["fix"].removeprefix("on worker1: sudo ").split("   #")[0]
    clean_lab.exec("worker1", ["sh", "-c", command], check=True)
    assert clean_lab.exec("worker1", ["getent", "hosts", "master"], check=True).stdout.split()[0] == master
    _, after = preflight(clean_lab, "--only", checks + ",collectives", "--nproc-per-node", "2", "--master-addr",
                         "master", expect=0)
    assert {r["status"] for r in after["results"]} == {"pass"}, [r for r in after["results"] if r["status"] != "pass"]
    clean_lab.clear_faults()
    assert f"{master}\tmaster" in clean_lab.exec("worker1", ["cat", "/etc/hosts"], check=True).stdout


def test_ipv6_off_on_a_worker_with_an_ipv6_master_address_is_named_there_and_its_fix_lets_a_real_job_through(
        clean_lab):
    # Issue 38: "RTNETLINK answers: Network is unreachable" and "another address family", with a fix
    # that only repeated `ip route get`; that IPv6 is off on worker1 was never said.
    clean_lab.add_fault("ipv6-off@worker1")
    master4, master6 = clean_lab.node("master").ipv4, clean_lab.node("master").ipv6
    checks = "master-reachable,interface-choice,ephemeral-ports,address-family"
    _, report = preflight(clean_lab, "--only", checks, "--master-addr", master6, expect=1)
    named = [r for r in report["results"] if r["status"] != "pass"]
    assert sorted((r["check"], r["node"], r["status"]) for r in named) == [
        ("interface-choice", "worker1", "fail"), ("master-reachable", "worker1", "fail")], report["results"]
    why = (f"IPv6 is disabled on worker1 (net.ipv6.conf.all.disable_ipv6 = 1), and the master's address {master6} is "
           "IPv6: worker1 has no IPv6 route")
    assert all(why in r["summary"] for r in named), named
    fix = (f"give the master's IPv4 address on eth0: --master-addr {master4} (MASTER_ADDR={master4} for torchrun)   "
           "# or turn IPv6 back on, on worker1: sudo sysctl -w net.ipv6.conf.all.disable_ipv6=0 "
           "net.ipv6.conf.default.disable_ipv6=0, and its IPv6 addresses come back from its network configuration")
    assert {r["fix"] for r in named} == {fix}, named
    # The fix as printed: the master's IPv4 address; then a real 2 x 2 Gloo job (the collectives probe).
    _, after = preflight(clean_lab, "--only", checks + ",collectives", "--nproc-per-node", "2", "--master-addr",
                         master4, expect=0)
    assert {r["status"] for r in after["results"]} == {"pass"}, [r for r in after["results"] if r["status"] != "pass"]
    clean_lab.clear_faults()
    shown = clean_lab.exec("worker1", ["ip", "-6", "-o", "addr", "show", "dev", "eth0"], check=True).stdout
    assert clean_lab.node("worker1").ipv6 + "/64" in shown


def test_a_partly_open_ephemeral_range_is_found_and_said_with_the_part_that_opens_and_its_fix_works(clean_lab):
    # Issue 38: only 40000-45000 of worker1's range open: caught by luck (two random ports a node),
    # and "only part of the range" never said. The listener now also holds ports spread across it.
    clean_lab.add_fault("firewall-part@worker1:40000-45000")
    _, report = preflight(clean_lab, *ONLY, expect=1)
    assert statuses_of(report) == {("master-reachable", "worker1"): "pass", ("ephemeral-ports", "master"): "pass",
                                   ("ephemeral-ports", "worker1"): "fail"}, report["results"]
    result = by(report, "ephemeral-ports", "worker1")
    assert ("from master: silently dropped (a firewall), only part of the range: 3 of the 16 ports tried across 32768-60999 "
            "opened (40296-44060), so Gloo's ports, which the kernel picks anywhere in it, connect or not by chance"
            in result["summary"]), result["summary"]
    # The fix as printed (its nftables form, for the ruleset the node has), then every path passes.
    nft = result["fix"].split("or nftables: sudo ")[1]
    clean_lab.exec("worker1", nft.split(), check=True)
    _, after = preflight(clean_lab, *ONLY, "--only", "master-reachable,ephemeral-ports,collectives", expect=0)
    assert {r["status"] for r in after["results"]} == {"pass"}, [r for r in after["results"] if r["status"] != "pass"]


def test_a_second_interfaces_route_that_takes_over_is_named_on_its_node_once_and_its_fix_lets_a_real_job_through(
        clean_lab):
    # Issue 38: a live second interface whose host route to the master takes over the LAN's was
    # "a firewall"; the route is the cause, named on worker1, with the command that removes it.
    clean_lab.add_fault("wrong-route@worker1")
    master = clean_lab.node("master").ipv4
    checks = "master-reachable,interface-choice,ephemeral-ports"
    _, report = preflight(clean_lab, "--only", checks, expect=1)
    named = [r for r in report["results"] if r["status"] != "pass"]
    assert sorted((r["check"], r["node"], r["status"]) for r in named) == [
        ("ephemeral-ports", "master", "warn"), ("ephemeral-ports", "worker1", "fail"),
        ("interface-choice", "worker1", "fail"), ("master-reachable", "worker1", "fail")], report["results"]
    fix = f"on worker1: sudo ip route del {master} dev eth1   # the master is then reached via eth0"
    assert {r["fix"] for r in named} == {fix}, named
    assert all("goes out eth1, which takes over the route of eth0, whose own subnet " in r["summary"]
               for r in named), named
    assert not any("firewall" in r["summary"] for r in named), named
    # The fix as printed, on worker1; then a real 2 x 2 Gloo job (the collectives probe) runs.
    clean_lab.exec("worker1", fix.removeprefix("on worker1: sudo ").split("   #")[0].split(), check=True)
    _, after = preflight(clean_lab, "--only", checks + ",collectives", "--nproc-per-node", "2", expect=0)
    assert {r["status"] for r in after["results"]} == {"pass"}, [r for r in after["results"] if r["status"] != "pass"]
    clean_lab.clear_faults()
    assert clean_lab.exec("worker1", ["ip", "-o", "link", "show", "eth1"]).returncode != 0
