"""Registering ranks through the watcher's indexes (hangwatch/state.py): which track a newly found
process replaces, joins or stands beside, each node's count and each rank's run, exactly as walking
every track said, also when tracks were added or deleted behind the indexes' back."""

from __future__ import annotations

from ddp_preflight.hangwatch.watch import Watcher, WatchTarget
from ddp_preflight.node import protocol
from ddp_preflight.transport import LocalNode


def _watcher(tmp_path, nodes=("master", "worker1")):
    return Watcher([WatchTarget(LocalNode(n, "python")) for n in nodes], clock=lambda: 0.0, wall=lambda: 1.0,
                   incident_dir=str(tmp_path))


def _found(watcher, node, pid, rank, master="10.0.0.1:29500", world=4):
    watcher.receive(node, {"type": "rank", "pid": pid, "ppid": 90, "rank": rank, "local_rank": rank % 2,
                           "world_size": world, "master": master, "env": {}})


def _tracks(watcher):
    """(node, pid) -> (rank, run, duplicate, ended)"""
    return {key: (t.view.rank, t.run, t.duplicate, t.ended) for key, t in watcher.state.ranks.items()}


def test_a_restarted_rank_replaces_its_ended_track_and_two_live_claims_stand_side_by_side(tmp_path):
    w = _watcher(tmp_path)
    for pid, rank in ((100, 0), (101, 1)):
        _found(w, "master", pid, rank)
    for pid, rank in ((102, 2), (103, 3)):
        _found(w, "worker1", pid, rank)
    assert {n: v.ranks for n, v in w.state.nodes.items()} == {"master": 2, "worker1": 2}
    assert {t.run for t in w.state.ranks.values()} == {1}
    w.receive("worker1", {"type": "exit", "pid": 103, "t": 2.0, "code": 256})
    _found(w, "worker1", 113, 3)                 # rank 3 again, a new process: its ended track goes
    _found(w, "master", 111, 1)                  # a second live process claims rank 1: both stay
    assert _tracks(w) == {("master", 100): (0, 1, False, False), ("master", 101): (1, 1, True, False),
                          ("worker1", 102): (2, 1, False, False), ("worker1", 113): (3, 1, False, False),
                          ("master", 111): (1, 1, True, False)}
    assert {n: v.ranks for n, v in w.state.nodes.items()} == {"master": 3, "worker1": 2}
    assert any("two live processes claim rank 1: pid 101 and pid 111" in m for m in w.state.messages)


def test_a_track_added_for_a_rank_that_ended_unseen_is_replaced_by_the_next_process_of_that_rank(tmp_path):
    # torchrun's word on a rank no agent saw adds its track outside the registration: the next
    # process found for that rank on that node must still replace it, and the node count it.
    w = _watcher(tmp_path, nodes=("master",))
    _found(w, "master", 100, 0, world=2)
    w.rank_ended("master", 1, 101, protocol.ExitStatus.from_wait_status(256))
    assert ("master", 101) in w.state.ranks
    _found(w, "master", 201, 1, world=2)
    assert set(w.state.ranks) == {("master", 100), ("master", 201)}
    assert w.state.nodes["master"].ranks == 2


def test_ranks_of_another_store_or_after_every_rank_ended_are_another_run(tmp_path):
    w = _watcher(tmp_path, nodes=("master",))
    _found(w, "master", 100, 0, world=2)
    _found(w, "master", 101, 1, world=2)
    _found(w, "master", 300, 0, master="10.0.0.1:29600", world=2)        # another store: another run
    _found(w, "master", 301, 1, master="10.0.0.1:29600", world=2)
    for pid in (100, 101):
        w.receive("master", {"type": "exit", "pid": pid, "t": 2.0, "code": 0})
    _found(w, "master", 200, 0, world=2)         # the first store again, every rank of its run ended
    _found(w, "master", 201, 1, world=2)
    runs = {pid: t.run for (_, pid), t in w.state.ranks.items()}
    assert runs == {300: 2, 301: 2, 200: 3, 201: 3}
