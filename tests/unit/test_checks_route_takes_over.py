"""A second interface whose route takes over the LAN's (issue 38), judged from a recorded lab:
worker1 got a veth vA (10.99.0.5/24, up) and a route 10.213.0.128/25 out vA, more specific than
eth0's 10.213.0.0/24, so its route to the master (10.213.0.200) goes out vA and nothing arrives.
Before: interface-choice said `export GLOO_SOCKET_IFNAME=vA` (pinning the detour), ephemeral-ports
and path-mtu gave no fix. Now every check names the one route with one fix."""

import copy
import json

from ddp_preflight.preflight.checks import BY_ID, run_checks
from ddp_preflight.preflight.model import Context, NodeFacts, Options

from .facts_fixtures import _recorded

CHECKS = [BY_ID[c] for c in ("interface-choice", "master-reachable", "ephemeral-ports", "path-mtu")]
FIX = "on worker1: sudo ip route del 10.213.0.128/25 dev vA   # the master is then reached via eth0"


def found(art):
    nodes = tuple(NodeFacts(n["node"], n["facts"], n["error"], n["fix"]) for n in art["nodes"])
    ctx = Context(nodes, Options(master_addr=art["master_addr"]), art["probes"])
    return sorted((r.check, r.node, r.status.value, r.fix, r.summary) for r in run_checks(ctx, CHECKS)
                  if r.status.value != "pass")


def test_every_check_names_the_route_that_takes_over_on_its_node_with_one_fix():
    got = found(json.loads(_recorded("lab_route_takes_over")))
    assert [(c, n, s, f) for c, n, s, f, _ in got] == [
        ("ephemeral-ports", "master", "warn", FIX), ("ephemeral-ports", "worker1", "fail", FIX),
        ("interface-choice", "worker1", "fail", FIX), ("master-reachable", "worker1", "fail", FIX),
        ("path-mtu", "worker1", "fail", FIX)]
    summaries = {(c, n): s for c, n, _, _, s in got}
    assert summaries["interface-choice", "worker1"] == (
        "worker1's route to the master (10.213.0.200) goes out vA, which takes over the route of eth0, whose own "
        "subnet 10.213.0.0/24 holds 10.213.0.200; the probe's connections between worker1 and the master got "
        "nowhere: no interface to pin until it is gone")
    assert summaries["ephemeral-ports", "worker1"] == (
        "worker1's ephemeral ports at 10.99.0.5 cannot be reached from master: unreachable (no route, or another "
        "address family); from worker2: unreachable (no route, or another address family): worker1's ranks bind "
        "10.99.0.5 on vA because its route to the master (10.213.0.200) goes out vA, which takes over the route of "
        "eth0, whose own subnet 10.213.0.0/24 holds 10.213.0.200")
    assert summaries["path-mtu", "worker1"] == (
        "master -> worker1, worker1 -> master, worker1 -> worker2, worker2 -> worker1: not measured: worker1's route "
        "to the master (10.213.0.200) goes out vA, which takes over the route of eth0, whose own subnet "
        "10.213.0.0/24 holds 10.213.0.200: its ranks bind vA's address, and what it sends the master goes nowhere")


def test_a_route_through_a_second_interface_that_works_is_no_cause_and_pinning_it_is_offered():
    # Derived: the same routes, but what worker1 sent the master out vA was answered (a VPN that
    # carries it). The route is then no fault: interface-choice keeps its pin, nothing says `ip route del`.
    art = json.loads(_recorded("lab_route_takes_over"))
    probes = copy.deepcopy(art["probes"])
    for pair in probes["network"]["pairs"]:
        if pair["src"] == "worker1" and pair["dst"] == "master":
            pair["outcome"] = "open"
    art["probes"] = probes
    got = found(art)
    assert all(f is None or "ip route del" not in f for _, _, _, f, _ in got)
    assert ("interface-choice", "worker1", "fail", "export GLOO_SOCKET_IFNAME=vA   # on worker1") in \
        [(c, n, s, f) for c, n, s, f, _ in got]


def test_a_route_that_policy_routing_picks_from_another_table_is_deleted_there():
    # Recorded: the same veth vA on worker1, the master's address routed out vA in table 100 by
    # `ip rule add to 10.213.0.200 lookup 100` (issue 38 variant: the fix was words, "route the
    # master's address through eth0", the route's prefix not read from its table).
    fix = "on worker1: sudo ip route del 10.213.0.200 dev vA table 100   # the master is then reached via eth0"
    got = found(json.loads(_recorded("lab_route_takes_over_table")))
    assert [(c, n, s, f) for c, n, s, f, _ in got] == [
        ("ephemeral-ports", "master", "warn", fix), ("ephemeral-ports", "worker1", "fail", fix),
        ("interface-choice", "worker1", "fail", fix), ("master-reachable", "worker1", "fail", fix),
        ("path-mtu", "worker1", "fail", fix)]


def test_the_same_route_judged_alike_whether_its_dials_timed_out_or_the_neighbour_never_answered():
    # The table recording's dials from worker1 ended in EHOSTUNREACH (its ARP entry for the master
    # on vA had failed by then); the first recording's, seconds after the route was added, timed
    # out ("filtered"). Derived: the first with worker1's dials to the master as the second's.
    art = json.loads(_recorded("lab_route_takes_over"))
    timed_out = [(c, n, s, f) for c, n, s, f, _ in found(art)]
    for pair in art["probes"]["network"]["pairs"]:
        if pair["src"] == "worker1" and pair["dst"] == "master":
            pair.update(outcome="unreachable", detail="EHOSTUNREACH: No route to host")
    assert [(c, n, s, f) for c, n, s, f, _ in found(art)] == timed_out
