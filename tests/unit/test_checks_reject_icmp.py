"""A REJECT rule that answers with ICMP (nftables' plain `reject`), told from one that answers with
a TCP reset (issue 38: every refusal was worded as a TCP reset). Recorded on a 3-node lab: worker1's
`ip saddr 10.213.0.200 tcp dport 32768-60999 ct state new reject`; the probe reads the ICMP error
from the socket's error queue (IP_RECVERR)."""

import copy
import json
import socket

from ddp_preflight.node.netprobe import try_connect
from ddp_preflight.preflight.checks import BY_ID, run_checks
from ddp_preflight.preflight.model import Context, NodeFacts, Options, Status

from .facts_fixtures import _recorded

FIX = ("on worker1: sudo ufw allow from 10.213.0.0/24 proto tcp to any port 32768:60999   # or nftables: sudo nft "
       "insert rule inet t46 input ip saddr 10.213.0.0/24 tcp dport 32768-60999 accept")


def failed(art):
    nodes = tuple(NodeFacts(n["node"], n["facts"], n["error"], n["fix"]) for n in art["nodes"])
    ctx = Context(nodes, Options(master_addr=art["master_addr"]), art["probes"])
    return [(r.node, r.status, r.summary, r.fix) for r in run_checks(ctx, [BY_ID["ephemeral-ports"]])
            if r.status is not Status.PASS]


def said(how):
    return ("new connections to worker1's ephemeral ports are blocked from master: refused although the probe "
            f"listened there ({how}). worker1 has the lower address, so it listens and master connects: Gloo's "
            "process-group creation fails with 'Connection refused'")


def test_a_reject_answered_with_icmp_is_said_as_such_with_the_rule_to_add():
    art = json.loads(_recorded("lab_probe_icmp_reject"))
    assert failed(art) == [("worker1", Status.FAIL, said("a REJECT rule: it answered with ICMP port unreachable"), FIX)]
    reset = copy.deepcopy(art)                       # derived: the same refusals without the ICMP error
    for pair in reset["probes"]["network"]["pairs"]:
        pair.pop("icmp", None)
    assert failed(reset) == [("worker1", Status.FAIL, said("a REJECT rule with a TCP reset"), FIX)]


def test_a_refusal_by_a_tcp_reset_reads_no_icmp_error():
    # Real: a free loopback port answers the SYN with a reset; nothing is queued.
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    got = try_connect({"dst": "here", "address": "127.0.0.1", "port": port, "kind": "closed"}, "t", 2.0)
    assert got["outcome"] == "refused" and "icmp" not in got
