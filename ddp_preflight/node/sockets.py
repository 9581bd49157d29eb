"""The ranks' TCP sockets as the kernel holds them, for hangwatch's agent: each rank's sockets,
their queues, how many it still holds, and the node's TIME_WAIT pairs (who closed first).
Standard library only."""

from __future__ import annotations

import os

from . import proc


def rank_sockets(pids, tables=None) -> dict:
    """Each rank's TCP sockets ({pid: [proc.TcpSocket]}), every network namespace's table read
    once (into `tables`, {netns: table}, when given: reading one costs milliseconds of the
    kernel's time, whatever its size). A rank whose files this user may not list is left out:
    unknown, never "none"."""
    tables = {} if tables is None else tables
    out = {}
    for pid in pids:
        inodes = proc.socket_inodes(pid)
        if inodes is None:
            continue
        netns = proc.netns(pid)
        if netns not in tables:
            tables[netns] = proc.tcp_table(pid)
        out[pid] = [s for s in tables[netns] if s.inode in inodes]
    return out


def socket_queues(pids) -> dict:
    """Each rank's established TCP connections as the kernel holds them: how many, the bytes sent
    and not yet acknowledged (unsent), the bytes arrived and not yet read (unread), how many its
    peer closed (CLOSE_WAIT); and the connections themselves (links: [local, remote]) with its
    sockets' local endpoints, counted with its stack: the meshes of its process groups as they
    are when it waits, whatever the last count between samples missed (a subgroup made just
    before the stall)."""
    out = {}
    for pid, mine in rank_sockets(pids).items():
        established = [s for s in mine if s.state == proc.ESTABLISHED]
        out[str(pid)] = {"established": len(established), "unsent": sum(s.unsent for s in established),
                         "unread": sum(s.unread for s in established),
                         "peer_closed": sum(1 for s in mine if s.state == proc.CLOSE_WAIT),
                         "links": sorted([s.local, s.remote] for s in established),
                         "endpoints": sorted({s.local for s in mine})}
    return out


def held_sockets(pids) -> dict:
    """Each rank's TCP sockets in any state (the ones it has not closed itself)."""
    return {pid: len(mine) for pid, mine in rank_sockets(pids).items()}


def closures(tables=None) -> list:
    """(local, remote) of every TIME_WAIT socket in this node's network namespace (the agent's, its
    ranks' too): the side that closed a connection first holds it, for a minute after (the watcher
    knows whose endpoint each one is). Read from the agent's own /proc entry (the ranks may be
    gone), or taken from `tables` when this sample read it already."""
    own = proc.netns(os.getpid())
    table = tables.get(own) if tables is not None and own is not None else None
    if table is None:
        table = proc.tcp_table(os.getpid())
        if tables is not None and own is not None:
            tables[own] = table
    return [[s.local, s.remote] for s in table if s.state == proc.TIME_WAIT]


def connections(pids) -> dict:
    """Each rank's established TCP connections (to the store, to its peers, to anything): none
    at all for a while means it joined no process group."""
    return {pid: sum(1 for s in mine if s.state == proc.ESTABLISHED) for pid, mine in rank_sockets(pids).items()}
