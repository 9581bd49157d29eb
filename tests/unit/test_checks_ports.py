"""master-reachable and ephemeral-ports, judged from recorded real probe data of the lab."""

import copy
import json

from ddp_preflight.preflight.checks import BY_ID, run_checks
from ddp_preflight.preflight.model import Context, NodeFacts, Options, Report, Status
from ddp_preflight.preflight.probes.network import rank_address

from .facts_fixtures import _recorded

PORT_CHECKS = [BY_ID["master-reachable"], BY_ID["ephemeral-ports"]]


def load(name):
    return json.loads(_recorded(name))


def ctx_of(art, probes=None):
    nodes = tuple(NodeFacts(n["node"], n["facts"], n["error"], n["fix"]) for n in art["nodes"])
    return Context(nodes, Options(master_addr=art["master_addr"]), art["probes"] if probes is None else probes)


def results(art, probes=None):
    return {(r.check, r.node): r for r in run_checks(ctx_of(art, probes), PORT_CHECKS)}


def test_the_clean_lab_passes_both_checks_in_both_directions():
    got = results(load("lab_probe_clean"))
    assert {k: r.status for k, r in got.items()} == {
        ("master-reachable", "worker1"): Status.PASS,
        ("ephemeral-ports", "master"): Status.PASS, ("ephemeral-ports", "worker1"): Status.PASS}


def test_firewalls_on_both_nodes_fail_where_gloo_listens_and_warn_where_it_does_not():
    got = results(load("lab_probe_firewalls"))
    worker, master = got[("ephemeral-ports", "worker1")], got[("ephemeral-ports", "master")]
    # worker1 (10.213.x.11) is below the master (.200): it listens, the master connects.
    assert worker.status is Status.FAIL and "from master: silently dropped" in worker.summary
    assert "master connects" in worker.summary and "Connect timeout" in worker.summary
    assert master.status is Status.WARN and "from worker1: silently dropped" in master.summary
    assert "sudo ufw allow from 10.213." in worker.fix and "/24 proto tcp to any port 32768:60999" in worker.fix
    assert got[("master-reachable", "worker1")].status is Status.PASS


def test_a_closed_port_that_times_out_is_a_firewall_even_if_listeners_answer():
    art = load("lab_probe_clean")
    probes = copy.deepcopy(art["probes"])
    for pair in probes["network"]["pairs"]:
        if pair["dst"] == "worker1" and pair["kind"] == "closed":
            pair["outcome"] = "filtered"      # derived: a rule that drops only some ports
    worker = results(art, probes)[("ephemeral-ports", "worker1")]
    assert worker.status is Status.FAIL and "silently dropped" in worker.summary


def test_a_probe_that_did_not_run_is_a_skip_or_an_error_never_a_pass():
    art = load("lab_probe_clean")
    assert all(r.status is Status.SKIP for r in results(art, {}).values())          # --no-probes
    skipped = results(art, {"network": {"skipped": "needs the master and at least one more reachable node"}})
    assert all(r.status is Status.SKIP for r in skipped.values())
    broken = results(art, {"network": {"error": "RuntimeError: boom"}})
    assert all(r.status is Status.ERROR and "boom" in r.summary for r in broken.values())


def _master_port_filtered(art):
    """worker1's master-reachable result on the recording, its dial to the master port derived as filtered."""
    probes = copy.deepcopy(art["probes"])
    for pair in probes["network"]["pairs"]:
        if pair["kind"] == "master":
            pair["outcome"] = "filtered"
    return results(art, probes)[("master-reachable", "worker1")]


def test_an_unreachable_master_port_fails_with_the_rule_to_add():
    # DERIVED: the master port filtered, on the lab whose master's ruleset drops (firewall@master).
    art = load("lab_probe_firewalls")
    result = _master_port_filtered(art)
    assert result.status is Status.FAIL and "rendezvous will time out" in result.summary
    assert result.fix.startswith("on master: sudo ufw allow proto tcp to any port 29500")
    assert "sudo nft insert rule inet ddp_lab_firewall input tcp dport 29500 accept" in result.fix


def test_no_firewall_fix_for_a_master_whose_ruleset_drops_nothing():
    # Issue 26: a worker's dead route was blamed on the master's firewall, with an nft command that
    # failed there (no such table). DERIVED: the master port filtered on the clean lab, whose
    # master's ruleset (read as root) has no drop: a fix is checked against the facts it applies to.
    art = load("lab_probe_clean")
    result = _master_port_filtered(art)
    assert (result.status, result.fix) == (Status.FAIL, None)
    master = art["master_addr"]
    assert result.summary.endswith(f"; the master's own firewall drops nothing on input (its ruleset, read as root), so "
                                   f"the connection is lost on the way or on worker1 (`ip route get {master}` there "
                                   "shows its route); rendezvous will time out"), result.summary


def listed(art, probes=None, checks=PORT_CHECKS):
    """Every result as (check, node, status), sorted: a node can have two ephemeral-ports results."""
    return sorted((r.check, r.node, r.status.value) for r in run_checks(ctx_of(art, probes), checks))


def own_path(art, node, probes=None):
    return next(r for r in run_checks(ctx_of(art, probes), PORT_CHECKS)
                if r.node == node and r.details.get("path") == "self")


def test_a_firewall_without_a_loopback_exemption_fails_the_master_to_itself():
    # Recorded: firewall-self@master, --nproc-per-node 2. Between the nodes only the master's
    # inbound side is dropped (a warning: it has the higher address); to itself it is a failure.
    art = load("lab_probe_self_firewall")
    assert listed(art) == [("ephemeral-ports", "master", "fail"), ("ephemeral-ports", "master", "warn"),
                           ("ephemeral-ports", "worker1", "pass"), ("ephemeral-ports", "worker1", "pass"),
                           ("master-reachable", "worker1", "pass")]
    result = own_path(art, "master")
    assert result.summary == (
        "master -> itself at 10.213.4.200:32768-60999: new connections are silently dropped (a firewall); its 2 "
        "ranks connect to each other there, so Gloo's process-group creation hangs, then fails in connectFullMesh "
        "('Connect timeout'). The path never leaves master: its own firewall drops it")
    assert result.fix == (
        "on master: sudo nft insert rule inet filter input iif lo accept   # its traffic to itself, to "
        "10.213.4.200 too, arrives on lo; or for that address alone: sudo nft insert rule inet filter input ip "
        "saddr 10.213.4.200 ip daddr 10.213.4.200 accept; with ufw: sudo ufw allow in on lo")
    assert {(p["src"], p["dst"]) for p in result.details["pairs"]} == {("master", "master")}
    # The rule goes in the chain that drops, as the node's ruleset names it (here a table of the
    # host's own beside Debian's empty `inet filter`), not in a chain the drop never passes through.
    other = copy.deepcopy(art)
    other["nodes"][0]["facts"]["network"]["firewall"]["rules"] = (
        "table inet filter {\n\tchain input {\n\t\ttype filter hook input priority filter; policy accept;\n\t}\n}\n"
        "table inet host_guard {\n\tchain inbound {\n\t\ttype filter hook input priority filter + 10; policy accept;\n"
        "\t\ttcp dport 32768-60999 ct state new drop\n\t}\n\tchain outbound {\n\t\ttype filter hook output "
        "priority filter; policy accept;\n\t}\n}\n")
    assert own_path(other, "master").fix == (
        "on master: sudo nft insert rule inet host_guard inbound iif lo accept   # its traffic to itself, to "
        "10.213.4.200 too, arrives on lo; or for that address alone: sudo nft insert rule inet host_guard inbound ip "
        "saddr 10.213.4.200 ip daddr 10.213.4.200 accept; with ufw: sudo ufw allow in on lo")
    assert own_path(art, "worker1").summary == ("worker1 -> itself at 10.213.4.11:32768-60999: new connections "
                                                "open (its 2 ranks connect to each other there)")


def test_a_reject_rule_on_the_node_to_itself_is_named_as_such():
    art = load("lab_probe_self_firewall")
    probes = copy.deepcopy(art["probes"])
    for pair in probes["network"]["pairs"]:
        if pair["src"] == pair["dst"] == "master":
            pair["outcome"] = "refused"     # derived: a REJECT rule with a TCP reset
    result = own_path(art, "master", probes)
    assert result.status is Status.FAIL and result.summary.endswith("its own firewall rejects it")
    assert "iif lo accept" in result.fix


def test_a_node_to_itself_that_fails_without_a_firewall_offers_no_firewall_fix():
    art = load("lab_probe_self_firewall")
    probes = copy.deepcopy(art["probes"])
    for pair in probes["network"]["pairs"]:
        if pair["src"] == pair["dst"] == "master":
            pair.update(outcome="unreachable", detail="EADDRNOTAVAIL: Cannot assign requested address")  # derived
    result = own_path(art, "master", probes)
    assert result.status is Status.FAIL and result.fix is None
    assert "unreachable (no route, or another address family) (EADDRNOTAVAIL" in result.summary


def test_one_node_with_two_ranks_judges_only_the_node_to_itself():
    art = load("lab_probe_self_firewall")
    probes = copy.deepcopy(art["probes"])
    network = probes["network"]
    network["listeners"] = {"master": network["listeners"]["master"]}
    network["pairs"] = [p for p in network["pairs"] if p["src"] == p["dst"] == "master"]
    network["master"] = {}          # as the probe leaves it: no worker dials the master port
    got = run_checks(ctx_of(art, probes), PORT_CHECKS)
    assert sorted((r.check, r.node, r.status.value) for r in got) == [
        ("ephemeral-ports", "master", "fail"), ("master-reachable", "master", "skip")]
    assert next(r for r in got if r.check == "master-reachable").summary == "one node: no worker dials the master"


def test_two_faults_on_one_node_are_two_results_each_with_its_own_fix():
    # Recorded: vpn-ipv6@worker1 and firewall@worker1. Gloo would bind the VPN's IPv6 address
    # (address-family's finding); the probe listened where the ranks bind once pinned, eth0's
    # IPv4, and found the firewall there too.
    art = load("lab_probe_two_faults")
    checks = [BY_ID["address-family"], *PORT_CHECKS]
    got = [r for r in run_checks(ctx_of(art), checks) if r.status is not Status.PASS]
    assert sorted((r.check, r.node, r.status.value) for r in got) == [
        ("address-family", "worker1", "fail"), ("ephemeral-ports", "worker1", "fail")]
    family, ports = sorted(got, key=lambda r: r.check)
    assert family.fix is not None and family.fix.startswith("export GLOO_SOCKET_IFNAME=eth0")
    assert ports.details["address"] == "10.213.4.11"
    assert "from master: silently dropped" in ports.summary and "master connects" in ports.summary
    assert ports.fix is not None and ports.fix.startswith("on worker1: sudo ufw allow from 10.213.4.0/24 proto tcp")


def test_the_probe_listens_where_the_ranks_bind_once_the_interface_is_pinned():
    # worker1's hostname resolves to the VPN's IPv6 address (what Gloo binds unpinned); the
    # interface preflight chose toward the master is eth0, whose IPv4 address the ranks bind.
    art = load("lab_probe_two_faults")
    ctx = ctx_of(art)
    worker = ctx.nodes[1]
    assert worker.parsed.network.gloo_bind.address == "fd7a:115c:a1e0::11"
    assert rank_address(worker, ctx.options) == ("10.213.4.11", "eth0")
    assert rank_address(ctx.master, ctx.options) == ("10.213.4.200", "eth0")


def test_a_dead_route_is_one_cause_on_its_node_with_one_fix():
    # Recorded: dead-route@worker1 (a host route to the master through eth1, a veth whose other end
    # is down: the kernel's linkdown). Issue 26: the master's firewall was blamed, with an nft
    # command for a table it does not have, and the ephemeral ports' fix put on the master.
    art = load("lab_dead_route")
    master = art["master_addr"]
    checks = [*PORT_CHECKS, BY_ID["interface-choice"]]
    found = sorted(((r.check, r.node, r.status.value, r.fix) for r in run_checks(ctx_of(art), checks)),
                   key=lambda x: (x[0], x[1]))
    fix = f"on worker1: sudo ip route del {master} dev eth1   # or bring eth1 up"
    assert found == [("ephemeral-ports", "master", "warn", fix), ("ephemeral-ports", "worker1", "fail", fix),
                     ("interface-choice", "master", "pass", None), ("interface-choice", "worker1", "fail", fix),
                     ("master-reachable", "worker1", "fail", fix)]
    got = results(art)
    assert got[("master-reachable", "worker1")].summary == (
        f"cannot reach the master at {master}:29500: worker1's route to {master} goes out eth1, which has no carrier "
        "(the kernel marks the route linkdown): its connections to the master go nowhere; rendezvous will time out")
    assert got[("ephemeral-ports", "worker1")].summary == (
        f"new connections to worker1's ephemeral ports from master get nowhere: worker1's route to {master} goes out "
        "eth1, which has no carrier (the kernel marks the route linkdown): its answers to the master go nowhere")


RP_CHECKS = [*PORT_CHECKS, BY_ID["interface-choice"]]


def found_rp(art, probes=None):
    return sorted(((r.check, r.node, r.status.value, r.fix) for r in run_checks(ctx_of(art, probes), RP_CHECKS)),
                  key=lambda x: (x[0], x[1]))


def test_a_strict_rp_filter_on_an_asymmetric_path_is_one_cause_on_its_node_with_one_fix():
    # Recorded: rp-filter@worker1 (a direct link eth1 to the master and a host route to it through
    # that link; the master still reaches worker1 on eth0; rp_filter 1 on worker1), the master having
    # talked to worker1 just before (it knew its link address: its packets reached worker1 and were
    # dropped there, and counted). Issue 26: the probes said "filtered" and blamed a firewall. The
    # filter on the asymmetric path is named on worker1, once, with the command that makes the path
    # symmetric, and the kernel's count said.
    art = load("lab_rp_filter")
    master, worker = art["master_addr"], art["faults"][1]["ipv4"]
    fix = (f"on worker1: sudo ip route del {master} dev eth1   # the master is then reached via eth0, where its "
           "packets arrive; or keep the route, with eth0 in loose mode: sudo sysctl -w net.ipv4.conf.eth0.rp_filter=2")
    assert found_rp(art) == [("ephemeral-ports", "master", "warn", fix), ("ephemeral-ports", "worker1", "fail", fix),
                             ("interface-choice", "master", "pass", None), ("interface-choice", "worker1", "fail", fix),
                             ("master-reachable", "worker1", "fail", fix)]
    why = (f"worker1's route to {master} goes out eth1, but what the master sends to {worker} arrives on eth0, whose "
           "reverse-path filter is strict (rp_filter 1): worker1 drops it (the kernel counted 24 reverse-path drops on "
           "worker1 while the probe ran)")
    got = {(r.check, r.node): r for r in run_checks(ctx_of(art), RP_CHECKS)}
    assert got[("master-reachable", "worker1")].summary == (
        f"cannot reach the master at {master}:29500: {why}; rendezvous will time out")
    assert got[("ephemeral-ports", "worker1")].summary == (
        f"new connections to worker1's ephemeral ports from master get nowhere: {why}")
    assert got[("ephemeral-ports", "master")].summary == (
        f"new connections to master's ephemeral ports from worker1 get nowhere: {why}")
    assert got[("interface-choice", "worker1")].summary == (
        f"{why}; the probe's connections between worker1 and the master got nowhere: no interface to pin until the "
        "paths agree")
    assert got[("master-reachable", "worker1")].details["reverse_path"] == {
        "node": "worker1", "arriving": "eth0", "address": worker, "rp_filter": 1,
        "drops_while_probed": 24}


def rp_variant(edit):
    art = load("lab_rp_filter")
    worker = art["nodes"][1]["facts"]["network"]
    edit(worker, art["probes"]["network"])
    return art


def iface(network, name):
    return next(i for i in network["interfaces"] if i["name"] == name)


def test_without_the_kernels_count_the_facts_and_the_drops_still_name_it():
    # DERIVED: where the master did not know worker1's link address, worker1 drops its ARP requests
    # (the same filter), which the kernel does not count: nothing counted (0), or an older node that
    # does not count (None). The facts and the dropped paths decide; the count is not said.
    for drops in (0, None):
        art = rp_variant(lambda _, probes, drops=drops: probes["listeners"]["worker1"].update(rp_filter_drops=drops))
        got = {(r.check, r.node): r for r in run_checks(ctx_of(art), RP_CHECKS)}
        assert got[("master-reachable", "worker1")].summary.endswith(
            "whose reverse-path filter is strict (rp_filter 1): worker1 drops it; rendezvous will time out")
        assert not any("kernel counted" in r.summary for r in got.values())
        assert {(k, r.status.value) for k, r in got.items() if "reverse-path" in r.summary} == {
            (("master-reachable", "worker1"), "fail"), (("ephemeral-ports", "worker1"), "fail"),
            (("ephemeral-ports", "master"), "warn"), (("interface-choice", "worker1"), "fail")}


def test_loose_or_no_reverse_path_filtering_is_never_named_and_the_master_gets_no_firewall_fix_either():
    # DERIVED: the same dropped paths and asymmetric route, with worker1's filter loose (2) or off
    # (0): the kernel does not drop for this: no rp_filter claim, and no firewall fix for the master,
    # whose ruleset (read as root) drops nothing.
    for value in (0, 2):
        art = rp_variant(lambda network, _, value=value: iface(network, "eth0").update(rp_filter=value))
        got = {(r.check, r.node): r for r in run_checks(ctx_of(art), RP_CHECKS)}
        assert not any("reverse-path" in r.summary or (r.fix and "rp_filter" in r.fix) for r in got.values())
        # Issue 38 (this expectation was the defect it names: "cause not known"): every dial silent and
        # worker1's route to the master out eth1, which takes over eth0's (whose subnet holds the
        # master), is a second interface's route taking over: named so, with its deletion, no firewall.
        reached = got[("master-reachable", "worker1")]
        assert reached.fix == "on worker1: sudo ip route del 10.213.0.200 dev eth1   # the master is then reached via eth0"
        assert "goes out eth1, which takes over the route of eth0, whose own subnet 10.213.0.0/24 holds " \
               "10.213.0.200: its connections to the master go nowhere" in reached.summary


def test_a_symmetric_route_or_an_open_path_is_not_the_filters_doing():
    # DERIVED: the route to the master out eth0, where the master's packets arrive: nothing to name.
    art = rp_variant(lambda network, _: network["route_to_master"].update(interface="eth0"))
    assert not any("reverse-path" in r.summary for r in run_checks(ctx_of(art), RP_CHECKS))
    # DERIVED: one of the master's connections to worker1 opened: its filter let that in, so it is
    # not what drops the others.
    art = load("lab_rp_filter")
    next(p for p in art["probes"]["network"]["pairs"] if p["src"] == "master" and p["kind"] == "listener")[
        "outcome"] = "open"
    assert not any("reverse-path" in r.summary for r in run_checks(ctx_of(art), RP_CHECKS))
    # DERIVED: every path open (the probe saw no drop): passes, whatever the facts say.
    art = load("lab_rp_filter")
    for pair in art["probes"]["network"]["pairs"]:
        pair["outcome"] = "open" if pair["kind"] in ("listener", "master") else "refused"
    assert {(r.check, r.node, r.status.value) for r in run_checks(ctx_of(art), PORT_CHECKS)} == {
        ("master-reachable", "worker1", "pass"), ("ephemeral-ports", "master", "pass"),
        ("ephemeral-ports", "worker1", "pass")}


def test_where_deleting_the_route_would_not_serve_the_fix_is_loose_mode_on_the_arriving_interface():
    # DERIVED: no main-table route out eth0 behind the host route (or it came from a policy table):
    # deleting it is not shown to help; loose mode on eth0 is, written as sysctl takes a VLAN's name.
    art = rp_variant(lambda network, _: network["route_to_master"].update(then_interface=None))
    fixes = {r.fix for r in run_checks(ctx_of(art), RP_CHECKS) if r.status is not Status.PASS}
    assert fixes == {"on worker1: sudo sysctl -w net.ipv4.conf.eth0.rp_filter=2   # loose mode: eth0 accepts what any "
                     "route leads back from, while worker1 answers out eth1, which must reach the master; keep it in "
                     "/etc/sysctl.d"}
    art = rp_variant(lambda network, _: network["route_to_master"].update(table="100"))
    assert {r.fix for r in run_checks(ctx_of(art), RP_CHECKS) if r.status is not Status.PASS} == fixes
    # DERIVED: the master's packets arrive on a VLAN, eth0.10: sysctl reads a dot as a level.
    art = rp_variant(lambda network, _: iface(network, "eth0").update(name="eth0.10"))
    assert {r.fix for r in run_checks(ctx_of(art), RP_CHECKS) if r.status is not Status.PASS} == {
        "on worker1: sudo sysctl -w net.ipv4.conf.eth0/10.rp_filter=2   # loose mode: eth0.10 accepts what any route "
        "leads back from, while worker1 answers out eth1, which must reach the master; keep it in /etc/sysctl.d"}


def peer_results(art, probes=None):
    results = run_checks(ctx_of(art, probes), RP_CHECKS)
    return results, {(r.check, r.node, r.status.value) for r in results}


WORKERS_ONLY = {("master-reachable", "worker1", "pass"), ("master-reachable", "worker2", "pass"),
                ("ephemeral-ports", "master", "pass"), ("interface-choice", "master", "pass"),
                ("interface-choice", "worker1", "pass"), ("interface-choice", "worker2", "pass"),
                ("ephemeral-ports", "worker1", "fail"), ("ephemeral-ports", "worker2", "warn")}


def test_a_dead_route_between_two_workers_is_named_on_the_node_that_has_it_with_one_fix():
    # Recorded: dead-route@worker1:worker2 in a 3-node lab (a host route from worker1 to worker2's
    # address through eth1, a veth whose other end is down). Issue 26: the path between the two
    # workers was a firewall, with a ufw fix on worker2 (and one on worker1). Each connector's dials
    # carry its own route there: the cause is worker1's route, named there, one fix, printed once.
    art = load("lab_dead_route_peer")
    w1, w2 = (n["ipv4"] for n in art["faults"][1:])
    results, found = peer_results(art)
    assert found == WORKERS_ONLY
    fix = f"on worker1: sudo ip route del {w2} dev eth1   # or bring eth1 up"
    named = [r for r in results if r.status is not Status.PASS]
    assert {r.fix for r in named} == {fix}
    assert [said.text for said in Report(tuple(results), ("master", "worker1", "worker2")).fixes] == [fix]
    why = f"worker1's route to {w2} goes out eth1, which has no carrier (the kernel marks the route linkdown)"
    got = {(r.check, r.node): r for r in results}
    assert got[("ephemeral-ports", "worker1")].summary == (
        f"new connections to worker1's ephemeral ports from worker2 get nowhere: {why}: its answers to worker2 go "
        "nowhere")
    assert got[("ephemeral-ports", "worker2")].summary == (
        f"new connections to worker2's ephemeral ports from worker1 get nowhere: {why}: its connections to worker2 "
        "go nowhere")
    assert got[("ephemeral-ports", "worker2")].details["route"]["interface"] == "eth1"


def test_a_strict_rp_filter_between_two_workers_is_named_on_the_node_that_has_it_with_one_fix():
    # Recorded: rp-filter@worker1:worker2 (a direct link eth1 from worker1 to worker2 and a host
    # route to worker2 through it; worker2 still reaches worker1 on eth0; rp_filter 1 on worker1).
    # The filter drops all worker2 sends worker1: named on worker1, the fix names worker2.
    art = load("lab_rp_filter_peer")
    w1, w2 = (n["ipv4"] for n in art["faults"][1:])
    results, found = peer_results(art)
    assert found == WORKERS_ONLY
    fix = (f"on worker1: sudo ip route del {w2} dev eth1   # worker2 is then reached via eth0, where its packets "
           "arrive; or keep the route, with eth0 in loose mode: sudo sysctl -w net.ipv4.conf.eth0.rp_filter=2")
    assert {r.fix for r in results if r.status is not Status.PASS} == {fix}
    assert [said.text for said in Report(tuple(results), ("master", "worker1", "worker2")).fixes] == [fix]
    why = (f"worker1's route to {w2} goes out eth1, but what worker2 sends to {w1} arrives on eth0, whose reverse-path "
           "filter is strict (rp_filter 1): worker1 drops it (the kernel counted 20 reverse-path drops on worker1 while "
           "the probe ran)")
    got = {(r.check, r.node): r for r in results}
    assert got[("ephemeral-ports", "worker1")].summary == (
        f"new connections to worker1's ephemeral ports from worker2 get nowhere: {why}")
    assert got[("ephemeral-ports", "worker2")].summary == (
        f"new connections to worker2's ephemeral ports from worker1 get nowhere: {why}")
    assert got[("ephemeral-ports", "worker1")].details["reverse_path"] == {
        "node": "worker1", "arriving": "eth0", "address": w1, "rp_filter": 1, "drops_while_probed": 20}


def test_a_peer_route_without_the_evidence_or_from_an_older_node_names_no_route_and_keeps_the_firewall_fix():
    # DERIVED: one of worker2's connections to worker1 answered (whatever drops the rest, it is not
    # worker1's route, which would lose them all); or the nodes did not say their routes (an older
    # node): the firewall's fix, on the node that listens, as before.
    for edit in ("answered", "no routes"):
        art = load("lab_dead_route_peer")
        pairs = art["probes"]["network"]["pairs"]
        if edit == "answered":
            next(p for p in pairs if p["src"] == "worker2" and p["dst"] == "worker1")["outcome"] = "open"
        else:
            for pair in pairs:
                del pair["route"]
        results = run_checks(ctx_of(art), RP_CHECKS)
        assert not any("route" in r.summary or (r.fix and "ip route" in r.fix) for r in results), edit
        assert {(r.node, r.fix.split(" proto")[0]) for r in results if r.status is not Status.PASS} == {
            ("worker1", "on worker1: sudo ufw allow from 10.213.1.0/24"),
            ("worker2", "on worker2: sudo ufw allow from 10.213.1.0/24")}, edit


def test_a_reject_is_said_in_glooss_words_for_it_not_as_a_timeout():
    # Issue 38: a REJECT rule (a TCP reset) was said "hangs, then fails with 'Connect timeout'",
    # the drop's words; Gloo's connect gets ECONNREFUSED at once: 'Connection refused'. DERIVED
    # from lab_probe_firewalls: the master's dials into worker1 refused instead of dropped.
    art = load("lab_probe_firewalls")
    for pair in art["probes"]["network"]["pairs"]:
        if pair["src"] == "master" and pair["dst"] == "worker1":
            pair["outcome"] = "refused" if pair["kind"] == "listener" else pair["outcome"]
    worker = results(art)[("ephemeral-ports", "worker1")]
    assert worker.status is Status.FAIL
    assert worker.summary.endswith("so it listens and master connects: Gloo's process-group creation fails with "
                                   "'Connection refused'"), worker.summary
    assert "Connect timeout" not in worker.summary
