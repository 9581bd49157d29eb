"""ddp_preflight/node/wire.py on real sockets: the bytes a process's TCP connections carried, as the kernel
counts them (sock_diag), and nothing of its files."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from ddp_preflight.node.wire import Wire

PEER = """
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
sys.stdin.readline()
s.sendall(b"x" * 50000)
sys.stdin.readline()
"""


def test_a_process_whose_connection_carries_bytes_moves_and_its_files_do_not(tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    peer = subprocess.Popen([sys.executable, "-c", PEER, str(server.getsockname()[1])], stdin=subprocess.PIPE,
                            text=True)
    try:
        conn, _ = server.accept()
        wire = Wire()
        before, mine = wire.moved(peer.pid, 1.0), wire.moved(os.getpid(), 1.0)
        (tmp_path / "f").write_bytes(b"y" * 100000)     # our own file: not the peer's connections
        assert before is not None and wire.moved(peer.pid, 2.0) == before      # its SYN aside: 0 or 1
        peer.stdin.write("\n")
        peer.stdin.flush()
        time.sleep(0.5)                                   # sent and received by the kernel, not read here:
        assert wire.moved(os.getpid(), 2.5) == mine       # nothing this process read (a sleeper's peers' bytes)
        assert wire.moved(peer.pid, 2.5) == before + 50000    # what the peer wrote, acked or not
        got = 0
        while got < 50000:
            got += len(conn.recv(65536))
        time.sleep(0.2)                                   # its ACKs back
        assert wire.moved(peer.pid, 3.0) == before + 50000     # acked: sent and arrived
        assert wire.moved(os.getpid(), 3.0) == mine + 50000    # read, on this end
    finally:
        peer.kill()                                       # the child this test started
        peer.wait(10)
        server.close()


def _walked(pid):
    """What a dump of the whole table says now (a Wire's first reading)."""
    return Wire().moved(pid, 0.0)


def test_a_connection_made_between_two_samples_counts_at_the_next_and_one_closed_stops_counting():
    # Between the dumps each known socket is asked for by its identity: what that reads must be
    # what a dump reads, a socket not seen before (a connection made since) must count at once,
    # and a closed one no more.
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(2)
    first = socket.create_connection(server.getsockname())
    one, _ = server.accept()
    me = os.getpid()
    try:
        wire = Wire()
        start = wire.moved(me, 1.0)
        assert start is not None
        first.sendall(b"a" * 1000)
        got = 0
        while got < 1000:
            got += len(one.recv(4096))
        time.sleep(0.1)
        assert wire.moved(me, 2.0) == _walked(me) == start + 2000        # written here, read here
        second = socket.create_connection(server.getsockname())
        two, _ = server.accept()
        second.sendall(b"b" * 3000)
        got = 0
        while got < 3000:
            got += len(two.recv(4096))
        time.sleep(0.1)
        third = wire.moved(me, 3.0)
        assert third == _walked(me) and third >= start + 2000 + 6000    # the new connection, both ends
        second.close()
        two.close()
        assert wire.moved(me, 4.0) == _walked(me) == start + 2000        # its ends closed: no longer ours
    finally:
        for s in (first, one, server):
            s.close()


def test_the_agent_counts_a_ranks_sockets_again_only_when_they_or_their_states_changed():
    # The TCP table costs milliseconds: a count whose sockets and states are as the wire's reading
    # has them is the last count; a peer that closed (CLOSE_WAIT) or a new connection is read anew.
    from ddp_preflight.node import proc
    from ddp_preflight.node.agent import Agent
    me = os.getpid()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(2)
    peer = subprocess.Popen([sys.executable, "-c", PEER, str(server.getsockname()[1])], stdin=subprocess.PIPE,
                            text=True)
    conn, _ = server.accept()
    other = None
    try:
        agent = Agent({"node": "here", "pids": [me], "py_spy": None})
        tables: dict = {}
        first = agent.count_sockets([me], tables, 1.0)[me]
        assert tables and {s.inode: s.state for s in first}[_inode(conn)] == proc.ESTABLISHED
        tables = {}
        assert agent.count_sockets([me], tables, 2.0)[me] == first and tables == {}      # nothing changed: not read
        peer.kill()                                   # its end closes: ours waits in CLOSE_WAIT, the same socket
        peer.wait(10)
        time.sleep(0.1)
        tables = {}
        closed = agent.count_sockets([me], tables, 3.0)[me]
        assert tables and {s.inode: s.state for s in closed}[_inode(conn)] == proc.CLOSE_WAIT
        other = socket.create_connection(server.getsockname())
        tables = {}
        again = agent.count_sockets([me], tables, 4.0)[me]
        assert tables and _inode(other) in {s.inode for s in again}
    finally:
        peer.kill()                                   # the child this test started
        peer.wait(10)
        for s in (conn, server, other):
            if s is not None:
                s.close()


def _inode(s: socket.socket) -> int:
    return os.fstat(s.fileno()).st_ino
