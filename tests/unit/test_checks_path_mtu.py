"""path-mtu, and what the bandwidth check says beside it, judged from recorded real probe data of the
lab: mtu-blackhole on both nodes, on worker1 only, and none (tests/unit/artifacts/record.py); and
lab_path_mtu_own_output: a netfilter rule in worker1's own output hook dropping its packets over
1000 bytes to the master (`meta length > 1000 drop`)."""

import copy
import json

from ddp_preflight.preflight.checks import BY_ID, run_checks
from ddp_preflight.preflight.model import Context, NodeFacts, Options, Status

from .facts_fixtures import _recorded

# One fix for both directions (issue 38: each direction's own order printed it twice for one cause).
FIX = ("on master: sudo ip link set dev eth0 mtu 1500; on worker1: sudo ip link set dev eth0 mtu 1500   # what passes "
       "between master and worker1; or make every hop between them (switch port, VLAN, tunnel) carry 9000-byte packets")
LOST = ("{a} -> {b}: packets over 1500 bytes are lost without an ICMP reply (eth0 MTU 9000 on both ends): TCP "
        "sends 9000-byte packets that way, so connections open and small collectives work but the first large "
        "one hangs")


def load(name):
    return json.loads(_recorded(name))


def results(art, probes=None, checks=("path-mtu",)):
    nodes = tuple(NodeFacts(n["node"], n["facts"], n["error"], n["fix"]) for n in art["nodes"])
    ctx = Context(nodes, Options(master_addr=art["master_addr"]), art["probes"] if probes is None else probes)
    return [(r.check, r.node, r.status, r.summary, r.fix) for r in run_checks(ctx, [BY_ID[c] for c in checks])]


def test_jumbo_frames_behind_a_1500_hop_fail_both_directions_with_both_ends_mtu_and_the_fix():
    assert set(results(load("lab_path_mtu_blackhole"))) == {
        ("path-mtu", a, Status.FAIL, LOST.format(a=a, b=b), FIX.format(a=a, b=b))
        for a, b in (("master", "worker1"), ("worker1", "master"))}


def test_the_bandwidth_job_is_not_started_over_a_black_hole_and_says_why_without_a_fix():
    [bandwidth] = results(load("lab_path_mtu_blackhole"), checks=("bandwidth",))
    assert bandwidth == ("bandwidth", None, Status.SKIP,
                         "not probed: master -> worker1: packets over 1500 bytes are lost without an ICMP reply "
                         "(eth0 MTU 9000 on both ends); a large all_reduce would hang there (see path-mtu)", None)


def test_jumbo_frames_on_one_end_warn_there_and_the_other_direction_passes():
    assert set(results(load("lab_path_mtu_one_end"))) == {
        ("path-mtu", "worker1", Status.WARN,
         "worker1 -> master: packets over 1500 bytes are lost without an ICMP reply (worker1's eth0 MTU 9000, "
         "master's eth0 MTU 1500): TCP to master stays at 1500 bytes (master's MTU), so Gloo works; anything larger "
         "worker1 sends that way is lost",
         "on worker1: sudo ip link set dev eth0 mtu 1500   # what passes between master and worker1; or make every "
         "hop between them (switch port, VLAN, tunnel) carry 9000-byte packets"),
        ("path-mtu", "master", Status.PASS,
         "don't-fragment packets from master's eth0 reach worker1 at full size (1500 bytes)", None)}


def test_a_drop_rule_in_a_nodes_own_output_is_a_failure_on_that_node_with_where_to_look():
    art = load("lab_path_mtu_own_output")
    master = art["master_addr"]
    assert set(results(art)) == {
        ("path-mtu", "worker1", Status.FAIL,
         f"worker1 -> master: worker1's own firewall refuses packets of 1001 bytes and more it sends to master "
         f"({master}), while 1000-byte ones pass: the kernel answered the send with EPERM, which a netfilter output "
         "rule on worker1 gives (nothing on the way or at master does); Gloo's large messages from worker1 to master "
         "will not get through",
         "on worker1: remove or narrow the output rule that drops them: `sudo nft -a list ruleset` shows the output "
         "hook's rules with their handles (`sudo iptables -S OUTPUT` where iptables is used)"),
        ("path-mtu", "master", Status.PASS,
         "don't-fragment packets from master's eth0 reach worker1 at full size (1500 bytes)", None)}
    # The bandwidth probe is not started over it (preflight/probes/bandwidth.py), and says why in these words.
    from ddp_preflight.preflight.checks.path_mtu import lost_words
    from ddp_preflight.preflight.probes.path_mtu_seen import PathMtuSeen
    [lost] = PathMtuSeen.from_json(art["probes"]["path-mtu"]).blackholes()
    assert lost_words(lost) == "worker1 -> master: worker1's own firewall refuses packets over 1000 bytes it sends to master"


def test_a_clean_lab_passes_from_each_node():
    assert set(results(load("lab_path_mtu_clean"))) == {
        ("path-mtu", a, Status.PASS, f"don't-fragment packets from {a}'s eth0 reach {b} at full size (1500 bytes)", None)
        for a, b in (("master", "worker1"), ("worker1", "master"))}


def test_a_hop_that_answers_with_icmp_passes_because_tcp_adapts():
    art = load("lab_path_mtu_clean")
    probes = copy.deepcopy(art["probes"])
    pair = probes["path-mtu"]["pairs"][0]          # derived: a router on the way says 1400 (ICMP frag needed)
    pair.update(passed=1400, lost=1401, refused=1401, learned_mtu=1400, outcome="learned")
    got = {r[1]: r for r in results(art, probes)}
    assert got["master"][2:] == (Status.PASS, "don't-fragment packets from master's eth0 reach worker1 up to 1400 "
                                 "bytes, as a hop said with ICMP 'fragmentation needed' (TCP adapts to it)", None)


def test_a_direction_that_could_not_be_measured_is_a_skip_without_a_fix():
    art = load("lab_path_mtu_clean")
    probes = copy.deepcopy(art["probes"])
    pair = probes["path-mtu"]["pairs"][1]          # derived: UDP dropped on the way
    pair.update(passed=None, lost=None, outcome="unanswered")
    got = {r[1]: r for r in results(art, probes)}
    assert got["worker1"][2:] == (Status.SKIP, "worker1 -> master: not measured: master's UDP probe at "
                                  f"{pair['address']}:{pair['port']} gave no answer, even to small packets (UDP to "
                                  "that port dropped on the way, or at it)", None)
    assert got["master"][2] is Status.PASS


def test_a_probe_that_did_not_run_is_a_skip_or_an_error_never_a_pass():
    art = load("lab_path_mtu_clean")
    assert results(art, {}) == [("path-mtu", None, Status.SKIP, "not probed (--no-probes)", None)]
    assert results(art, {"path-mtu": {"skipped": "needs at least two reachable nodes"}}) == [
        ("path-mtu", None, Status.SKIP, "not probed: needs at least two reachable nodes", None)]
    probes = copy.deepcopy(art["probes"])
    probes["path-mtu"]["errors"] = {"worker1": "the echo did not start"}
    probes["path-mtu"]["pairs"] = []
    assert results(art, probes) == [
        ("path-mtu", "worker1", Status.ERROR, "worker1: the path-MTU probe did not run: the echo did not start", None)]


def test_the_destinations_that_pass_at_one_size_are_named_in_one_clause():
    art = load("lab_path_mtu_clean")
    probes = copy.deepcopy(art["probes"])
    pairs = probes["path-mtu"]["pairs"]
    pairs.append({**pairs[0], "dst": "worker2"})        # derived: a third node, reached the same way
    got = {r[1]: r for r in results(art, probes)}
    assert got["master"][3] == "don't-fragment packets from master's eth0 reach worker1, worker2 at full size (1500 bytes)"


def test_one_end_too_large_for_two_peers_is_one_result_with_one_fix():
    # Recorded: worker2's eth0 at MTU 9000 on a 3-node lab whose others are at 1500 (issue 38: one
    # cause, one fix per peer, the same command printed twice).
    got = results(load("lab_path_mtu_one_end_two_peers"))
    assert [r for r in got if r[2] is not Status.PASS] == [(
        "path-mtu", "worker2", Status.WARN,
        "worker2 -> master, worker1: packets over 1500 bytes are lost without an ICMP reply (worker2's eth0 MTU "
        "9000; master's eth0 MTU 1500, worker1's eth0 MTU 1500): TCP to each stays at its MTU, so Gloo works; "
        "anything larger worker2 sends them is lost",
        "on worker2: sudo ip link set dev eth0 mtu 1500   # what passes between worker2 and master, worker1; or make "
        "every hop between them (switch port, VLAN, tunnel) carry 9000-byte packets")]


def test_one_hop_too_small_for_three_jumbo_nodes_is_one_fix_for_every_direction():
    # Recorded: eth0 at MTU 9000 on all three nodes of a 3-node lab whose switch carries 1500 (issue
    # 38: three fixes, each pair's, the same commands printed twice each).
    got = results(load("lab_path_mtu_blackhole_three"))
    pairs = [(a, b) for a in ("master", "worker1", "worker2") for b in ("master", "worker1", "worker2") if a != b]
    fix = ("on master: sudo ip link set dev eth0 mtu 1500; on worker1: sudo ip link set dev eth0 mtu 1500; on "
           "worker2: sudo ip link set dev eth0 mtu 1500   # what passes between master, worker1 and worker2; or make "
           "every hop between them (switch port, VLAN, tunnel) carry 9000-byte packets")
    assert sorted(got) == sorted(("path-mtu", a, Status.FAIL, LOST.format(a=a, b=b), fix) for a, b in pairs)
