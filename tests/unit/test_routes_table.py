"""A dead route policy routing picked from another table (`ip rule ... lookup 100`): its fix
deletes it from that table. `ip route get` names the table (node/facts/network.py reads it);
`ip route del` without it looks in the main table alone and fails there ("No such process")."""

from ddp_preflight.rules.facts.network import Route
from ddp_preflight.rules.routes import drop_route


def test_a_dead_route_from_another_table_is_deleted_from_that_table():
    route = Route("10.213.0.200", "10.213.0.200", "eth1", prefix="10.213.0.200", flags=("linkdown",), table="100")
    assert drop_route("worker1", route).text() == \
        "on worker1: sudo ip route del 10.213.0.200 dev eth1 table 100   # or bring eth1 up"


def test_one_from_the_main_table_names_none():
    route = Route("10.213.0.200", "10.213.0.200", "eth1", prefix="10.213.0.200", flags=("linkdown",))
    assert drop_route("worker1", route).text() == "on worker1: sudo ip route del 10.213.0.200 dev eth1   # or bring eth1 up"


def _nodes(name: str):
    import json
    from pathlib import Path

    from ddp_preflight.rules.facts import NodeFacts

    art = json.loads((Path(__file__).parent / "artifacts" / f"{name}.json").read_text())
    return art, {n["node"]: NodeFacts(n["node"], n["facts"], n["error"], n["fix"]) for n in art["nodes"]}


def test_a_route_out_a_second_live_interface_over_the_lans_subnet_is_a_detour_and_the_lans_own_is_not():
    # Issue 38, on the recorded rp-filter lab: worker1's route to the master goes out eth1 (a live
    # direct link) while eth0's own subnet holds the master's address; the master's route is its LAN's.
    from ddp_preflight.rules.routes import detour

    _, nodes = _nodes("lab_rp_filter")
    found = detour(nodes["worker1"])
    assert found is not None
    route, why, lan = found
    assert (route.interface, lan) == ("eth1", "eth0")
    assert why == "takes over the route of eth0, whose own subnet 10.213.0.0/24 holds 10.213.0.200"
    assert drop_route("worker1", route, instead=lan).text() == \
        "on worker1: sudo ip route del 10.213.0.200 dev eth1   # the master is then reached via eth0"
    _, clean = _nodes("lab_probe_clean")
    assert detour(clean["worker1"]) is None


def test_ipv6_off_with_an_ipv6_master_address_gives_the_masters_ipv4_and_nothing_otherwise():
    # DERIVED from the clean lab's facts: worker1's net.ipv6.conf.all.disable_ipv6 = 1.
    import copy

    from ddp_preflight.rules.facts import NodeFacts
    from ddp_preflight.rules.routes import ipv6_off

    art, nodes = _nodes("lab_probe_clean")
    master = nodes["master"]
    six = next(a.address for i in master.parsed.network.interfaces for a in i.addresses
               if a.family == 6 and a.scope == "global")
    facts = copy.deepcopy(art["nodes"][1]["facts"])
    facts["network"]["disable_ipv6"] = 1
    off = NodeFacts("worker1", facts, None, None)
    found = ipv6_off(off, master, six)
    assert found is not None
    assert found[0] == (f"IPv6 is disabled on worker1 (net.ipv6.conf.all.disable_ipv6 = 1), and the master's address "
                        f"{six} is IPv6: worker1 has no IPv6 route")
    assert found[1].text().startswith("give the master's IPv4 address on eth0: --master-addr 10.213.0.200 "
                                      "(MASTER_ADDR=10.213.0.200 for torchrun)")
    assert ipv6_off(off, master, "10.213.0.200") is None               # an IPv4 master address: not this
    assert ipv6_off(nodes["worker1"], master, six) is None             # IPv6 on: not this
