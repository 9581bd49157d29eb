"""IPv6 disabled on a node's interface (net.ipv6.conf.eth0.disable_ipv6 = 1) rather than for all
(issue 38, a variant of 'IPv6 disabled on a worker'): recorded on a 3-node lab, where worker2's
eth0 lost its IPv6 addresses and a dial to the master's IPv6 address said only 'Network is
unreachable', with no cause and no fix."""

import copy
import json

from ddp_preflight.rules.facts import NodeFacts
from ddp_preflight.rules.routes import ipv6_off

from .facts_fixtures import _recorded

SIX = "fd64:6470:213::200"      # the master's IPv6 address on eth0


def nodes(art):
    return {n["node"]: NodeFacts(n["node"], n["facts"], n["error"], n["fix"]) for n in art["nodes"]}


def test_ipv6_off_on_the_interface_is_named_with_its_own_setting_and_the_masters_ipv4():
    got = nodes(json.loads(_recorded("lab_ipv6_off_on_eth0")))
    why, fix = ipv6_off(got["worker2"], got["master"], SIX)
    assert why == ("IPv6 is disabled on worker2's eth0 (net.ipv6.conf.eth0.disable_ipv6 = 1), and the master's "
                   f"address {SIX} is IPv6: worker2 has no IPv6 route")
    assert fix.text() == ("give the master's IPv4 address on eth0: --master-addr 10.213.0.200 (MASTER_ADDR=10.213.0.200 "
                          "for torchrun)   # or turn IPv6 back on, on worker2: sudo sysctl -w "
                          "net.ipv6.conf.eth0.disable_ipv6=0, and its IPv6 addresses come back from its network "
                          "configuration")
    assert ipv6_off(got["worker1"], got["master"], SIX) is None          # IPv6 on there
    assert ipv6_off(got["worker2"], got["master"], "10.213.0.200") is None


def test_an_interface_with_ipv6_off_is_not_the_cause_where_another_holds_a_global_ipv6_address():
    # Derived: worker2's eth0 given its IPv6 address back in the facts, as another interface would hold one.
    art = json.loads(_recorded("lab_ipv6_off_on_eth0"))
    facts = copy.deepcopy(art["nodes"][2]["facts"])
    eth0 = next(i for i in facts["network"]["interfaces"] if i["name"] == "eth0")
    eth0["addresses"].append({"family": 6, "address": "fd64:6470:213::12", "prefixlen": 64, "scope": "global"})
    assert ipv6_off(NodeFacts("worker2", facts, None, None), nodes(art)["master"], SIX) is None
