"""The collectives job is not started over a path the network probe found blocked (issue 26: it
waited out its 15 s bound there, and bench/probes.py's blocked cluster took 1.59x a clean one).
Decided on recorded real probe data of the lab: which address each node's ranks bind as the node
is set up (Gloo's bind, in its facts) and once pinned (the probe's listener), and which dials
into those addresses the probe found blocked. The job itself is never reached where it must not
start: the cluster given here fails the test if a job is started on it."""

from __future__ import annotations

import pytest

from ddp_preflight.preflight.model import Options
from ddp_preflight.preflight.probes import collectives
from ddp_preflight.preflight.probes.collectives import _binds
from ddp_preflight.preflight.probes.network_seen import NetworkSeen

from .test_checks_ports import ctx_of, load


class NoJobs:
    """A cluster whose every node is usable and on which no job may start."""

    def __init__(self, n: int):
        self.n = n

    def usable(self) -> list[int]:
        return list(range(self.n))

    def job(self, *args, **kwargs):
        pytest.fail("a job was started over a path the network probe found blocked")


def _blocked_first(name: str, nproc: int | dict) -> list[tuple[str, str, str, str]]:
    """nproc: every node's ranks, or each node's own ({node: ranks})."""
    art = load(name)
    nodes = ctx_of(art).nodes
    seen = NetworkSeen.from_json(art["probes"]["network"])
    ranks = nproc if isinstance(nproc, dict) else {n.node: nproc for n in nodes}
    return sorted({(d.src, d.dst, d.sent.get("address"), d.kind.value)
                   for d in seen.blocking(_binds(nodes, list(range(len(nodes)))), ranks)})


def test_as_set_up_the_ranks_bind_what_the_hostname_resolves_to_and_only_its_blocked_paths_count():
    # Every hostname resolves to IPv6: unpinned ranks bind IPv6. A firewall for IPv6 alone blocks
    # them; one for IPv4 alone does not (their job would form: it is started).
    assert _blocked_first("lab_probe_ipv6_firewall", 1) == [
        ("master", "worker1", "fd64:6470:213::11", "closed"), ("master", "worker1", "fd64:6470:213::11", "listener")]
    assert _blocked_first("lab_probe_ipv4_firewall", 1) == []
    assert _blocked_first("lab_probe_clean", 1) == []


def test_a_nodes_own_blocked_port_counts_only_when_its_ranks_connect_to_each_other():
    own = ("master", "master", "10.213.4.200", "listener")
    with_two = _blocked_first("lab_probe_self_firewall", 2)
    with_one = _blocked_first("lab_probe_self_firewall", 1)
    assert own in with_two and own not in with_one
    assert ("worker1", "master", "10.213.4.200", "listener") in with_one
    # Each node by its own count (a hostfile's slots): the master's own path counts where the
    # master runs two ranks, whatever worker1 runs, and not where it runs one.
    assert own in _blocked_first("lab_probe_self_firewall", {"master": 2, "worker1": 1})
    assert own not in _blocked_first("lab_probe_self_firewall", {"master": 1, "worker1": 3})


@pytest.mark.parametrize("name, nproc, summary", [
    ("lab_probe_firewalls", 1, "master -> worker1's port {port} on 10.213.0.11 is blocked (filtered), so the job's "
                               "ranks could not connect (see ephemeral-ports)"),
    ("lab_probe_self_firewall", 2, "master -> its own port {port} on 10.213.4.200 is blocked (filtered), so the "
                                   "job's ranks could not connect (see ephemeral-ports)"),
])
def test_blocked_both_as_set_up_and_pinned_no_job_starts_and_the_path_is_said(name, nproc, summary):
    art = load(name)
    ctx = ctx_of(art)
    options = Options(master_addr=art["master_addr"], nproc_per_node=nproc)
    out = collectives.probe(NoJobs(len(ctx.nodes)), ctx.nodes, options, network=art["probes"]["network"])
    first = out["blocked"][0]
    assert out["skipped"] == summary.format(port=first["port"])
    assert {(d["src"], d["dst"]) for d in out["blocked"]} == \
        {(a, b) for a, b, _, _ in _blocked_first(name, nproc)}


def _one_way(backend: str | None) -> dict:
    """DERIVED from lab_probe_firewalls (a firewall on both nodes): the master's dials into worker1
    made what lab_probe_clean recorded for them (worker1's firewall gone), so the master alone drops
    new connections, from worker1 into its ephemeral ports; the backend as a run of today's probe says it."""
    art, clean = load("lab_probe_firewalls"), load("lab_probe_clean")
    network = art["probes"]["network"]
    opened = [p for p in clean["probes"]["network"]["pairs"] if p["src"] == "master"]
    network["pairs"] = [p for p in network["pairs"] if p["src"] != "master"] + opened
    if backend is not None:
        network["backend"] = backend
    return art


def test_one_direction_blocked_that_gloo_never_takes_does_not_stop_the_job():
    # Issue 38: the master (10.213.0.200, the higher address) drops new connections from worker1.
    # Gloo's higher address connects and the lower listens, so its ranks only ever dial worker1:
    # the job was skipped with "worker1 -> master's port ... is blocked" although training works.
    art = _one_way("gloo")
    ctx = ctx_of(art)
    seen = NetworkSeen.from_json(art["probes"]["network"])
    binds = _binds(ctx.nodes, [0, 1])
    assert seen.blocking(binds, {"master": 1, "worker1": 1}) == []
    started = []

    class Started(NoJobs):
        def job(self, *args, **kwargs):
            started.append(args)
            raise RuntimeError("the job starts here")

    with pytest.raises(RuntimeError, match="the job starts here"):
        collectives.probe(Started(2), ctx.nodes, Options(master_addr=art["master_addr"]),
                          network=art["probes"]["network"])
    assert started


@pytest.mark.parametrize("backend", ["nccl", None])
def test_one_direction_blocked_stops_a_job_whose_backend_dials_both_ways_or_does_not_say(backend):
    art = _one_way(backend)
    seen = NetworkSeen.from_json(art["probes"]["network"])
    blocked = seen.blocking(_binds(ctx_of(art).nodes, [0, 1]), {"master": 1, "worker1": 1})
    assert sorted({(d.src, d.dst, d.kind.value) for d in blocked}) == [
        ("worker1", "master", "closed"), ("worker1", "master", "listener")]


def test_both_directions_blocked_gloo_counts_the_one_its_higher_address_dials():
    art = load("lab_probe_firewalls")
    art["probes"]["network"]["backend"] = "gloo"
    seen = NetworkSeen.from_json(art["probes"]["network"])
    blocked = seen.blocking(_binds(ctx_of(art).nodes, [0, 1]), {"master": 1, "worker1": 1})
    assert sorted({(d.src, d.dst, d.kind.value) for d in blocked}) == [
        ("master", "worker1", "closed"), ("master", "worker1", "listener")]
