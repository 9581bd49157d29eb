"""Loss of a node's own making (issue 38), from recorded 3-node labs: worker2's nftables rule
`numgen random mod 100 < 5 drop` on its output hook (what it sends), and on its input hook (what
it receives). Before, both were named on worker2 with a fix that only said where to look (its
ruleset, its cable); the ruleset its facts read holds the rule, and deleting it is the fix."""

import json

from ddp_preflight.preflight.checks import BY_ID, run_checks
from ddp_preflight.preflight.model import Context, NodeFacts, Options, Status

from .facts_fixtures import _recorded


def lossy(art):
    nodes = tuple(NodeFacts(n["node"], n["facts"], n["error"], n["fix"]) for n in art["nodes"])
    ctx = Context(nodes, Options(master_addr=art["master_addr"]), art["probes"])
    return [r for r in run_checks(ctx, [BY_ID["bandwidth"]]) if r.status is not Status.PASS]


def delete(hook, what):
    rule = f'{"oifname" if hook == "output" else "iifname"} "eth0" numgen random mod 100 < 5 drop'
    return (f"on worker2: sudo nft delete rule inet t46 {hook} handle $(sudo nft -a list chain inet t46 {hook} | "
            f"grep -F '{rule} #' | sed 's/.*# handle //')   # the rule in inet t46 {hook} that drops a random share "
            f"of what worker2 {what}")


def test_a_rule_dropping_a_share_of_what_the_node_sends_is_named_and_deleted():
    [loss] = lossy(json.loads(_recorded("lab_bandwidth_own_output_loss")))
    assert (loss.node, loss.status, loss.fix) == ("worker2", Status.WARN, delete("output", "sends"))
    assert loss.summary.startswith("worker2 drops what it sends to worker1: ")
    assert ("they were dropped on worker2 before they left; worker2's own nftables rule drops a random share of them "
            "(inet t46 output: `oifname \"eth0\" numgen random mod 100 < 5 drop`); every step's all_reduce crosses "
            "that path") in loss.summary


def test_a_rule_dropping_a_share_of_what_the_node_receives_is_named_and_deleted():
    [loss] = lossy(json.loads(_recorded("lab_bandwidth_own_input_loss")))
    assert (loss.node, loss.status, loss.fix) == ("worker2", Status.WARN, delete("input", "receives"))
    assert loss.summary.startswith("packets are lost on the way from master to worker2: ")
    assert ("; worker2's own nftables rule drops a random share of them (inet t46 input: `iifname \"eth0\" numgen "
            "random mod 100 < 5 drop`); over TCP") in loss.summary


def test_without_such_a_rule_on_the_hook_the_loss_crosses_no_rule_fix_is_offered():
    # Derived: the receiving node's rule moved to its output hook (it would not drop what it
    # receives), and then gone: the fix only says where to look, as before.
    art = json.loads(_recorded("lab_bandwidth_own_input_loss"))
    firewall = art["nodes"][2]["facts"]["network"]["firewall"]
    firewall["rules"] = firewall["rules"].replace("hook input", "hook output")
    [loss] = lossy(art)
    assert loss.fix == ("find where worker2 drops them: ssh worker2 ip -s link show eth0 (RX errors and drops), then "
                        "its cable, switch port or Wi-Fi; wire it if it is Wi-Fi")
    assert "nftables rule" not in loss.summary
