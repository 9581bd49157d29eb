"""node-reachable where nothing answered ssh: this machine's own route to the node, judged by the
rule that judges a node's route to the master (issue 38). The machine's network facts as the
collector reads them; the lab test (tests/lab/test_ssh_route_lab.py) has the second interface's
route that takes over; here the recorded dead route (a link without carrier) and a route that is fine."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from ddp_preflight.preflight.checks import BY_ID, run_checks
from ddp_preflight.preflight.model import Context, NodeFacts, Status

DEAD = json.loads((Path(__file__).parent / "artifacts" / "lab_dead_route.json").read_text())


def unreachable(network: dict) -> NodeFacts:
    return NodeFacts("worker9", {"dialled_from_here": network}, "worker9: no route to host: nothing answers at its "
                     "address on the network", "check that worker9 is on and connected, and that HostName in the ssh "
                     "config is its address")


def reachable_results(node: NodeFacts):
    return run_checks(Context((node,)), [BY_ID["node-reachable"]])


def test_a_dead_link_on_this_machine_is_the_cause_with_the_route_to_delete():
    # The recorded worker1's network (its host route to 10.213.2.200 out eth1, linkdown), read as
    # the network of the machine that dialled: what it sends there goes nowhere.
    here = copy.deepcopy(next(n for n in DEAD["nodes"] if n["node"] == "worker1")["facts"]["network"])
    [result] = reachable_results(unreachable(here))
    assert (result.status, result.node) == (Status.ERROR, "worker9")
    assert result.summary == ("worker9: nothing answers ssh at 10.213.2.200: this machine's route to 10.213.2.200 goes "
                              "out eth1, which has no carrier (the kernel marks the route linkdown): its connections to "
                              "worker9 go nowhere")
    assert result.fix == "on this machine: sudo ip route del 10.213.2.200 dev eth1   # or bring eth1 up"


def test_a_route_out_the_lan_or_to_this_machines_own_address_leaves_the_transports_own_words():
    worker1 = next(n for n in DEAD["nodes"] if n["node"] == "worker1")["facts"]["network"]
    fine = copy.deepcopy(worker1)
    fine["route_to_master"].update(interface="eth0", flags=[], prefix="10.213.2.0/24")
    # The recorded master's network, dialling its own address (the route goes out lo): no detour either.
    own = copy.deepcopy(next(n for n in DEAD["nodes"] if n["node"] == "master")["facts"]["network"])
    for here in (fine, own):
        [result] = reachable_results(unreachable(here))
        assert result.summary == "worker9: no route to host: nothing answers at its address on the network"
        assert "ip route" not in (result.fix or "")
