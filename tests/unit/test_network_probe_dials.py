"""What each node's network probe dials, from the listeners a recorded lab probe reported:
each node dials itself only where it runs more than one rank by its own count (a hostfile's
slots), and the check says that node's count."""

import copy
import json

from ddp_preflight.preflight.checks import BY_ID, run_checks
from ddp_preflight.preflight.model import Context, NodeFacts, Options
from ddp_preflight.preflight.probes.network import dial_targets

from .facts_fixtures import _recorded


def recorded():
    return json.loads(_recorded("lab_probe_self_firewall"))


def dialled(src, own, master_addr=None):
    out = recorded()["probes"]["network"]
    return sorted({(t["dst"], t["kind"]) for t in dial_targets(src, out, own, {}, ["master", "worker1"],
                                                                master_addr, 29500)})


def test_a_node_dials_itself_only_where_its_own_count_is_more_than_one_rank():
    # master 1 slot, worker1 2 slots (a hostfile): only worker1's ranks connect to each other.
    own = {"worker1"}
    assert dialled("master", own) == [("worker1", "closed"), ("worker1", "listener")]
    assert dialled("worker1", own, "10.213.4.200") == [
        ("master", "closed"), ("master", "listener"), ("master", "master"),
        ("worker1", "closed"), ("worker1", "listener")]
    assert dialled("master", {"master"}) == [("master", "closed"), ("master", "listener"),
                                             ("worker1", "closed"), ("worker1", "listener")]
    assert dialled("worker1", set(), "master") == [("master", "closed"), ("master", "listener"),
                                                   ("master", "master")]


def test_the_node_to_itself_names_its_own_count_of_ranks():
    art = recorded()
    probes = copy.deepcopy(art["probes"])
    probes["network"]["ranks"] = {"master": 3, "worker1": 4}
    nodes = tuple(NodeFacts(n["node"], n["facts"], n["error"], n["fix"]) for n in art["nodes"])
    got = run_checks(Context(nodes, Options(master_addr=art["master_addr"]), probes), [BY_ID["ephemeral-ports"]])
    self_paths = {r.node: r for r in got if r.details.get("path") == "self"}
    assert self_paths["worker1"].summary == ("worker1 -> itself at 10.213.4.11:32768-60999: new connections open "
                                             "(its 4 ranks connect to each other there)")
    assert self_paths["worker1"].details["ranks_per_node"] == 4
    assert "its 3 ranks connect to each other there, so Gloo's process-group creation hangs" in \
        self_paths["master"].summary
