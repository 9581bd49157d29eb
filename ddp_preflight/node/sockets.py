"""The ranks' TCP sockets as the kernel holds them, for hangwatch's agent: each rank's sockets,
their queues, how many it still holds, and the node's TIME_WAIT pairs (who closed first).
Standard library only."""

from __future__ import annotations

import os

from . import proc


def rank_sockets(pids, tables=None, read_against=None) -> dict:
    """Each rank's TCP sockets ({pid: [proc.TcpSocket]}), every network namespace's table read
    once (into `tables`, {netns: table}, when given: reading one costs milliseconds of the
    kernel's time, whatever its size). A rank whose files this user may not list is left out:
    unknown, never "none". Every rank's sockets are listed before any table is read, so a socket
    a rank held when listed and that is not in the table is not a TCP one. `read_against`, when
    given, gets each rank's listed inodes where its table was read after them: a count kept for
    later holds for those inodes alone (a socket made after the listing changes them; one listed
    before a table read earlier, by another reader, may be missing from it: not given). The
    kernel's table is read in pieces while sockets come and go, and may list one twice: each
    socket counts once."""
    tables = {} if tables is None else tables
    listed = {}
    for pid in pids:
        inodes = proc.socket_inodes(pid)
        if inodes is not None:
            listed[pid] = (inodes, proc.netns(pid))
    earlier = set(tables)
    out = {}
    for pid, (inodes, netns) in listed.items():
        if netns not in tables:
            table = proc.tcp_table_read(pid)
            if table is None:           # gone since it was listed: unknown, and no table for the others
                continue
            tables[netns] = table
        out[pid] = list({s.inode: s for s in tables[netns] if s.inode in inodes}.values())
        if read_against is not None and netns not in earlier:
            read_against[pid] = inodes
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
