"""A slow node whose own queue caps what it sends (issue 38), from a recorded 3-node lab:
worker2's eth0 under `tc qdisc add dev eth0 root tbf rate 5mbit burst 32kbit latency 400ms`
(network, path-mtu and bandwidth probes, tests/unit/artifacts/record.py). Before, the slow node
was named with no fix; the node's facts read its root qdisc, and the cap is the fix."""

import copy
import json

from ddp_preflight.preflight.checks import BY_ID, run_checks
from ddp_preflight.preflight.model import Context, NodeFacts, Options, Status

from .facts_fixtures import _recorded

FIX = ("on worker2: sudo tc qdisc del dev eth0 root   # its tbf queue caps what eth0 sends at 5.0 Mbit/s; the "
       "kernel's default queue then serves")


def verdicts(art, params=None):
    nodes = tuple(NodeFacts(n["node"], n["facts"], n["error"], n["fix"]) for n in art["nodes"])
    ctx = Context(nodes, Options(master_addr=art["master_addr"], params=params), art["probes"])
    return [r for r in run_checks(ctx, [BY_ID["bandwidth"]]) if r.status is not Status.PASS]


def worker2_eth0(art):
    return next(i for i in art["nodes"][2]["facts"]["network"]["interfaces"] if i["name"] == "eth0")


def test_the_slow_nodes_own_queue_is_named_with_the_command_that_removes_it_with_or_without_params():
    art = json.loads(_recorded("lab_bandwidth_shaped"))
    [slow] = verdicts(art)
    assert (slow.check, slow.node, slow.status, slow.fix) == ("bandwidth", "worker2", Status.WARN, FIX)
    assert slow.summary.startswith("worker2's links are the slow ones (worker2's eth0 (veth, 10000 Mbit/s nominal)): ")
    assert slow.summary.endswith("(each link's bytes over the time it had data to send, the kernel's TCP_INFO); "
                                 "worker2's eth0 sends through a tbf queue capped at 5.0 Mbit/s (tc qdisc), below "
                                 "what the others carried; every step's all_reduce waits for worker2")
    assert slow.details["shaper"] == {"interface": "eth0", "kind": "tbf", "rate_bytes_per_s": 625000}
    with_params = verdicts(art, params=10_000_000)
    assert [(r.node, r.fix) for r in with_params] == [("worker2", FIX), ("worker2", FIX)]
    assert "; the slow node: worker2. " in with_params[1].summary


def test_without_a_queue_that_caps_it_the_slow_node_gets_no_fix_it_did_not_see():
    art = json.loads(_recorded("lab_bandwidth_shaped"))
    del worker2_eth0(art)["shaper"]           # derived: the same rates, no qdisc seen (the wire, a switch)
    [slow] = verdicts(art)
    assert (slow.node, slow.fix) == ("worker2", None) and "tc qdisc" not in slow.summary
    fast = copy.deepcopy(json.loads(_recorded("lab_bandwidth_shaped")))
    worker2_eth0(fast)["shaper"]["rate_bytes_per_s"] = 10_000 * 125_000     # derived: a cap above the others' rates
    [slow] = verdicts(fast)
    assert (slow.node, slow.fix) == ("worker2", None)


def test_on_two_nodes_a_link_held_at_its_senders_cap_below_its_nominal_speed_is_named():
    # Recorded: the lab's master and worker1 alone, worker1's eth0 under tbf rate 5mbit (issue 38:
    # with no third node to compare with, bandwidth passed while its own figures said a
    # 100M-parameter model would take 666 s a step).
    art = json.loads(_recorded("lab_bandwidth_shaped_two_nodes"))
    [capped] = verdicts(art)
    assert (capped.node, capped.fix) == ("worker1", FIX.replace("worker2", "worker1"))
    assert capped.summary.startswith("worker1's eth0 sends through a tbf queue capped at 5.0 Mbit/s (tc qdisc), below "
                                     "its link's 10000 Mbit/s nominal: worker1 -> master carried ")
    assert capped.summary.endswith(" Mbit/s, about the cap (the kernel's TCP_INFO); every step's all_reduce "
                                   "waits for that link")
    # Derived: a cap far above what the link carried (something else held it), and none.
    eth0 = next(i for i in art["nodes"][1]["facts"]["network"]["interfaces"] if i["name"] == "eth0")
    eth0["shaper"]["rate_bytes_per_s"] = 1000 * 125_000        # 1 Gbit/s, far above the 5 Mbit/s it carried
    assert verdicts(art) == []
    del eth0["shaper"]
    assert verdicts(art) == []
