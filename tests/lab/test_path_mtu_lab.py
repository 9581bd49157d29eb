"""Jumbo frames on the nodes behind the lab's 1500-byte switch (mtu-blackhole): a real large
Gloo all_reduce hangs while a small one passes, and preflight names path-mtu on the exact pairs
before any job could hang on it."""

from __future__ import annotations

import json
import os
import secrets
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ddp_preflight.lab.system import ip_batch, run
from ddp_preflight.preflight.probes import bandwidth

from .ddp import ssh
from .test_preflight_lab import by, preflight

JOB = Path(__file__).parent / "large_allreduce.py"
LARGE = 64 << 20


def link(lab, netns: str, dev: str) -> tuple[int, int]:
    """(mtu, gso_max_segs) of a link, read with ip -d."""
    info = json.loads(run(["ip", "-n", netns, "-j", "-d", "link", "show", "dev", dev]).stdout)[0]
    return info["mtu"], info["gso_max_segs"]


def all_reduce(lab, port: int, pg_timeout: float = 15) -> dict[str, dict[str, dict]]:
    """Each node's steps of large_allreduce.py (small, then 64 MiB), by node and step."""
    master = lab.node("master").ipv4

    def one(rank: int) -> tuple[str, dict[str, dict]]:
        node = ("master", "worker1")[rank]
        command = (f"GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 PG_TIMEOUT={pg_timeout} LARGE_BYTES={LARGE} "
                   f"RANK={rank} WORLD_SIZE=2 MASTER_ADDR={master} MASTER_PORT={port} "
                   f"{shlex.quote(sys.executable)} {shlex.quote(str(JOB))}")
        done = ssh(lab, node, command, timeout=pg_timeout * 4 + 60)
        steps = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"step"')]
        return node, {s["step"]: s for s in steps}

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(one, range(2)))


def test_the_fault_sets_jumbo_frames_on_the_node_and_leaves_its_switch_port_at_1500(clean_lab):
    lab = clean_lab
    node = lab.node("worker1")
    assert link(lab, node.netns, "eth0") == (1500, 65535)
    lab.add_fault("mtu-blackhole@worker1:4000")
    assert link(lab, node.netns, "eth0") == (4000, 1)
    assert link(lab, lab.state.switch_netns, node.switch_port)[0] == 1500
    lab.clear_faults(["mtu-blackhole@worker1"])
    assert link(lab, node.netns, "eth0") == (1500, 65535)


def test_a_clean_lab_passes_path_mtu_on_every_pair_and_the_large_all_reduce_completes(clean_lab):
    _, report = preflight(clean_lab, "--only", "path-mtu", expect=0)
    got = {(r["node"], r["status"], r["summary"]) for r in report["results"]}
    assert got == {
        ("master", "pass", "don't-fragment packets from master's eth0 reach worker1 at full size (1500 bytes)"),
        ("worker1", "pass", "don't-fragment packets from worker1's eth0 reach master at full size (1500 bytes)")}
    steps = all_reduce(clean_lab, port=29560)
    print(f"\nclean all_reduce steps: {steps}")
    assert all(s["small"]["ok"] and s["large"]["ok"] for s in steps.values()), steps


def test_jumbo_frames_behind_a_1500_hop_hang_a_large_all_reduce_and_preflight_names_both_directions_first(clean_lab):
    lab = clean_lab
    lab.add_fault("mtu-blackhole@master")
    lab.add_fault("mtu-blackhole@worker1")

    started = time.monotonic()
    _, report = preflight(lab, "--only", "path-mtu,bandwidth", expect=1)
    took = time.monotonic() - started
    print(f"\npreflight --only path-mtu,bandwidth with the fault: {took:.1f} s")
    # Named without waiting out the bandwidth job's bound first: that job never started.
    assert took < bandwidth.TIMEOUT, took
    # One cause, one fix: both directions carry the same fix, its nodes and pair in name order (printed once).
    fix = ("on master: sudo ip link set dev eth0 mtu 1500; on worker1: sudo ip link set dev eth0 mtu 1500   # what "
           "passes between master and worker1; or make every hop between them (switch port, VLAN, tunnel) carry "
           "9000-byte packets")
    summary = ("{a} -> {b}: packets over 1500 bytes are lost without an ICMP reply (eth0 MTU 9000 on both ends): "
               "TCP sends 9000-byte packets that way, so connections open and small collectives work but the first "
               "large one hangs")
    assert {(r["node"], r["status"], r["summary"], r["fix"]) for r in by(report, "path-mtu")} == {
        (a, "fail", summary.format(a=a, b=b), fix)
        for a, b in (("master", "worker1"), ("worker1", "master"))}
    skipped = by(report, "bandwidth")
    assert [(r["status"], r["summary"], r["fix"]) for r in skipped] == [
        ("skip", "not probed: master -> worker1: packets over 1500 bytes are lost without an ICMP reply (eth0 MTU "
                 "9000 on both ends); a large all_reduce would hang there (see path-mtu)", None)]
    for r in by(report, "path-mtu"):
        print(f"path-mtu {r['node']}: {r['details']['pair']['seconds']} s for its pair, "
              f"probe stage {r['details']['probe_seconds']} s")

    # The real thing: the small all_reduce passes, the 64 MiB one hangs until a timeout ends it:
    # TCP's, giving up on its full-size segments (ETIMEDOUT from Gloo's writev), or Gloo's own,
    # waiting for data that never comes (PG_TIMEOUT); whichever fires first, the other rank then
    # times out too or sees its peer close. Nothing else ends it.
    steps = all_reduce(lab, port=29561)
    print(f"all_reduce steps: {steps}")
    assert all(s["small"]["ok"] for s in steps.values()), steps
    assert not any(s["large"]["ok"] for s in steps.values()), steps
    ends = [s["large"]["error"] for s in steps.values()]
    timed_out = [e for e in ends if "Connection timed out" in e or "Timed out waiting 15000ms" in e]
    assert timed_out and all(e in timed_out or "Connection closed by peer" in e for e in ends), ends


def test_jumbo_frames_on_one_end_only_warn_and_tcp_stays_under_the_other_ends_mtu(clean_lab):
    lab = clean_lab
    lab.add_fault("mtu-blackhole@worker1")
    _, report = preflight(lab, "--only", "path-mtu", expect=0)
    assert {(r["node"], r["status"], r["summary"], r["fix"]) for r in by(report, "path-mtu")} == {
        ("worker1", "warn", "worker1 -> master: packets over 1500 bytes are lost without an ICMP reply (worker1's "
                            "eth0 MTU 9000, master's eth0 MTU 1500): TCP to master stays at 1500 bytes (master's MTU), "
                            "so Gloo works; anything larger worker1 sends that way is lost",
         "on worker1: sudo ip link set dev eth0 mtu 1500   # what passes between master and worker1; or make every "
         "hop between them (switch port, VLAN, tunnel) carry 9000-byte packets"),
        ("master", "pass", "don't-fragment packets from master's eth0 reach worker1 at full size (1500 bytes)", None)}
    # What the warning says: the large all_reduce goes through.
    steps = all_reduce(lab, port=29562)
    assert all(s["small"]["ok"] and s["large"]["ok"] for s in steps.values()), steps


ROOT = Path(__file__).resolve().parents[2]
RUN = ("import json, sys; sys.path.insert(0, sys.argv[1]); from ddp_preflight.node import pathmtu; "
       "pathmtu.main(json.loads(sys.argv[2]))")


def test_a_router_that_answers_fragmentation_needed_is_learned_not_a_black_hole():
    """Three namespaces of its own (a 9000 host, a router whose far side carries 1400, a 9000
    host): the router sends ICMP 'fragmentation needed', the kernel learns 1400, TCP adapts."""
    tag = secrets.token_hex(2)
    a, r, b = (f"pmtu{tag}-{n}" for n in ("a", "r", "b"))
    try:
        ip_batch([f"netns add {n}" for n in (a, r, b)] +
                 [f"link add x0 netns {a} type veth peer name r0 netns {r}",
                  f"link add x0 netns {b} type veth peer name r1 netns {r}"])
        ip_batch(["link set lo up", "addr add 10.251.1.2/24 dev x0", "link set x0 up mtu 9000",
                  "route add default via 10.251.1.1"], netns=a)
        ip_batch(["link set lo up", "addr add 10.251.2.2/24 dev x0", "link set x0 up mtu 9000",
                  "route add default via 10.251.2.1"], netns=b)
        ip_batch(["addr add 10.251.1.1/24 dev r0", "link set r0 up mtu 9000",
                  "addr add 10.251.2.1/24 dev r1", "link set r1 up mtu 1400"], netns=r)
        run(["ip", "netns", "exec", r, "sysctl", "-qw", "net.ipv4.ip_forward=1"])
        token = secrets.token_hex(16)
        echo = subprocess.Popen(["ip", "netns", "exec", b, sys.executable, "-c", RUN, str(ROOT), json.dumps(
            {"mode": "echo", "address": "10.251.2.2", "interface": "x0", "token": token, "duration": 20})],
            stdout=subprocess.PIPE, text=True)
        try:
            port = json.loads(echo.stdout.readline().split(" ", 1)[1])["port"]
            done = run(["ip", "netns", "exec", a, sys.executable, "-c", RUN, str(ROOT), json.dumps(
                {"mode": "probe", "address": "10.251.1.2", "interface": "x0", "token": token, "timeout": 5,
                 "targets": [{"dst": "b", "address": "10.251.2.2", "port": port}]})])
        finally:
            os.kill(echo.pid, 15)
            echo.wait(10)
        [pair] = json.loads(done.stdout.split(" ", 1)[1])["pairs"]
        assert (pair["outcome"], pair["route_mtu"], pair["passed"], pair["learned_mtu"], pair["refused"]) == \
            ("learned", 9000, 1400, 1400, 1401), pair
    finally:
        for n in (a, r, b):
            run(["ip", "netns", "del", n], check=False)


def test_a_drop_rule_on_a_nodes_own_output_is_named_on_that_node_and_removing_it_lets_training_through(clean_lab):
    # Issue 26: a netfilter rule in worker1's own output hook drops its packets over 1000 bytes to
    # the master. The kernel answers such a send with EPERM (nothing on the way does): that is the
    # finding, on worker1, with where to look. The large all_reduce hangs with it, and passes once
    # the rule is gone (the fix), as preflight then says too.
    lab = clean_lab
    netns, master = lab.node("worker1").netns, lab.node("master").ipv4
    table = "ddpp_own_output_" + secrets.token_hex(3)
    rules = (f"add table inet {table}\n"
             f"add chain inet {table} out {{ type filter hook output priority 0 ; }}\n"
             f"add rule inet {table} out ip daddr {master} meta length > 1000 drop\n")
    subprocess.run(["ip", "netns", "exec", netns, "nft", "-f", "-"], input=rules, text=True, check=True)
    try:
        _, report = preflight(lab, "--only", "path-mtu", expect=1)
        found = {(r["node"], r["status"]) for r in by(report, "path-mtu")}
        assert found == {("worker1", "fail"), ("master", "pass")}, by(report, "path-mtu")
        [result] = [r for r in by(report, "path-mtu") if r["node"] == "worker1"]
        blocked, passed = result["details"]["blocked"], result["details"]["pair"]["passed"]
        assert passed <= 1000 < blocked <= 1500, result["details"]
        assert result["summary"] == (
            f"worker1 -> master: worker1's own firewall refuses packets of {blocked} bytes and more it sends to "
            f"master ({master}), while {passed}-byte ones pass: the kernel answered the send with EPERM, which a "
            "netfilter output rule on worker1 gives (nothing on the way or at master does); Gloo's large messages "
            "from worker1 to master will not get through")
        assert result["fix"].startswith("on worker1: remove or narrow the output rule that drops them: "
                                        "`sudo nft -a list ruleset`"), result["fix"]
        steps = all_reduce(lab, port=29563, pg_timeout=10)
        assert all(s["small"]["ok"] for s in steps.values()) and not any(s["large"]["ok"] for s in steps.values()), \
            steps
    finally:
        subprocess.run(["ip", "netns", "exec", netns, "nft", "delete", "table", "inet", table], check=True)
    # The fix: the rule is gone. preflight passes and the large all_reduce goes through.
    _, report = preflight(lab, "--only", "path-mtu", expect=0)
    assert {(r["node"], r["status"]) for r in by(report, "path-mtu")} == {("worker1", "pass"), ("master", "pass")}
    steps = all_reduce(lab, port=29564)
    assert all(s["small"]["ok"] and s["large"]["ok"] for s in steps.values()), steps
