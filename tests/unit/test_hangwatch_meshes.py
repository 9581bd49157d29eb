"""The process groups ranks share, from their connections (hangwatch/meshes.py), on the connections
real agents counted in a lab run (subgroup-plain.jsonl: 2 nodes x 2 ranks, new_group([0, 1])),
and derived from them."""

from __future__ import annotations

import dataclasses

from ddp_preflight.hangwatch.meshes import shared_groups

from .test_hangwatch_watch import replay


def tracks(tmp_path):
    """The ranks as the watcher knows them 12 s into the hang (the recording ends with their stop)."""
    header, _, _ = replay("subgroup-plain", tmp_path, until=0)
    _, watcher, _ = replay("subgroup-plain", tmp_path, until=header["fault_at"] + 12)
    return sorted(watcher.state.ranks.values(), key=lambda t: t.key)


def test_the_world_joins_every_pair_once_and_the_subgroup_its_members_once_more(tmp_path):
    ranks = tracks(tmp_path)
    assert [t.key for t in ranks] == [0, 1, 2, 3] and all(t.links for t in ranks)
    assert shared_groups(ranks) == (frozenset({0, 1}),)


def test_without_the_subgroups_second_connection_no_group_is_said(tmp_path):
    ranks = tracks(tmp_path)
    zero, one = ranks[0], ranks[1]
    between = [(local, remote) for local, remote in zero.links if remote in one.endpoints]
    assert len(between) == 2            # the world's and the subgroup's
    dropped = {between[0], (between[0][1], between[0][0])}
    plain = [dataclasses.replace(t, links=t.links - dropped) for t in ranks]
    assert shared_groups(plain) == ()


def test_a_pair_with_no_connection_or_a_rank_not_counted_says_nothing(tmp_path):
    ranks = tracks(tmp_path)
    two, three = ranks[2], ranks[3]
    cut = {(a, b) for a, b in two.links if b in three.endpoints} | {(a, b) for a, b in three.links if b in two.endpoints}
    assert shared_groups([dataclasses.replace(t, links=t.links - cut) for t in ranks]) == ()
    assert shared_groups([*ranks[:3], dataclasses.replace(ranks[3], links=frozenset())]) == ()


def test_connections_to_a_store_rank_0_serves_are_no_group(tmp_path):
    # env:// without torchrun: rank 0 serves the store at MASTER_PORT, and every rank holds a
    # connection to it; derived: each rank given one more connection to rank 0's store endpoint.
    ranks = tracks(tmp_path)
    port = ranks[0].info.master.rpartition(":")[2]
    store = f"{next(iter(ranks[0].endpoints)).rpartition(':')[0]}:{port}"
    served = [dataclasses.replace(ranks[0], endpoints=ranks[0].endpoints | {store})]
    for i, t in enumerate(ranks[1:], start=1):
        mine = f"{next(iter(t.endpoints)).rpartition(':')[0]}:{40000 + i}"
        served.append(dataclasses.replace(t, endpoints=t.endpoints | {mine}, links=t.links | {(mine, store)}))
        served[0] = dataclasses.replace(served[0], links=served[0].links | {(store, mine)})
    assert shared_groups(served) == (frozenset({0, 1}),)
