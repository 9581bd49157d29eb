"""The network probe over the lab: firewalls caught on the right node and in the right direction."""

from __future__ import annotations

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


def test_an_ipv6_only_listener_is_unreachable_from_the_ipv4_master(clean_lab):
    clean_lab.add_fault("vpn-ipv6@worker1")
    _, report = preflight(clean_lab, *ONLY, expect=1)
    result = by(report, "ephemeral-ports", "worker1")
    assert result["status"] == "fail" and "unreachable" in result["summary"]


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
