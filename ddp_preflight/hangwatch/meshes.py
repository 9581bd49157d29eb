"""The process groups a run's ranks share, from their connections alone (attached runs have no
Flight Recorder to say which group a collective is in). Gloo connects every pair of a process
group's members once (its full mesh, made when the group is created), so the world's group
joins every pair of ranks by one connection, and each subgroup (dist.new_group) joins its own
members by one more. Ranks joined pairwise by more connections than the rest share a group of
their own: its members. Pure: the ranks' counted connections in, groups out."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import combinations

from .ended import owners
from .state import Track
from .who import Who


def _port(endpoint: str | None) -> str | None:
    return endpoint.rpartition(":")[2] if endpoint else None


def shared_groups(tracks: Iterable[Track]) -> tuple[frozenset[Who], ...]:
    """The sets of ranks that share a process group beside the one of the whole run, as their
    connections show (largest first); () where the connections cannot say: a rank whose
    connections were not counted, a pair of ranks with none (no full mesh: not Gloo's, or not yet
    made), or extra connections that do not make whole groups. Connections to the store (the
    rank's MASTER_PORT, which rank 0 may serve itself) are not a group's."""
    tracks = [t for t in tracks if not t.ended]
    if len(tracks) < 3 or any(not t.links or not t.endpoints for t in tracks):
        return ()
    owner = owners(tracks)
    store_ports = {_port(t.info.master) for t in tracks if t.info is not None and t.info.master}
    pairs: dict[frozenset[Who], set[frozenset[str]]] = {}
    for t in tracks:
        for local, remote in t.links:
            peer = owner.get(remote)
            if peer is None or peer == t.key or _port(local) in store_ports or _port(remote) in store_ports:
                continue
            pairs.setdefault(frozenset((t.key, peer)), set()).add(frozenset((local, remote)))
    n = len(tracks)
    if len(pairs) != n * (n - 1) // 2:
        return ()        # a pair of ranks with no connection: not one full mesh
    counts = {pair: len(found) for pair, found in pairs.items()}
    base = min(counts.values())
    extra = {pair for pair, n in counts.items() if n > base}
    groups: list[frozenset[Who]] = []
    left = set(extra)
    while left:
        # One group: the ranks joined to each other by the extra connections, which must join
        # every pair of them (a group's mesh is whole), and no more than one extra each.
        members = set(next(iter(left)))
        grew = True
        while grew:
            grew = False
            for pair in list(left):
                if pair & members and not pair <= members:
                    members |= pair
                    grew = True
        inside = {frozenset(p) for p in combinations(sorted(members, key=str), 2)}
        if len(members) > len(tracks) - 1 or not inside <= extra or any(counts[p] != base + 1 for p in inside):
            return ()
        groups.append(frozenset(members))
        left -= inside
    return tuple(sorted(groups, key=lambda g: (-len(g), sorted(map(str, g)))))
