"""The bytes each rank has moved through its TCP connections, as the kernel counts them, per socket,
read with one sock_diag dump of the node's network namespace per sample: what it wrote (TCP_INFO's
bytes_acked + the send queue) and what it read (bytes_received - the receive queue). Progress that
CPU cannot show. Only what the rank itself wrote or read counts: a peer's bytes that the kernel
received for a rank that sleeps (a barrier's message to a rank checkpointing) wait in its receive
queue and move nothing; its own sent bytes acked meanwhile leave its send queue. A rank whose step
is mostly waiting (a straggler's peers, a rank behind a checkpoint) uses under 5% of a core, yet
each collective it completes moves bytes on its connections; a rank that waits for a peer that never
sends moves none. Only the connections count: its own files (the Flight Recorder's answer to our
ask, a log) are not progress of the training, and never reset the quiet clock.

A dump walks the kernel's whole TCP hash table, whatever the namespace holds (1.5 ms of CPU a family
on a 2-core box): it is done once in WALK_EVERY samples, and when a rank holds a socket not seen
before. In between each socket is asked for by its identity (addresses, ports and the kernel's
cookie, as the dump gave them): a hash lookup, all of them in one message. Same bytes, read cheaply.

Standard library only, Python 3.8+, Linux 4.2+ (bytes_received; an older kernel gives None, never a
wrong figure). A rank in another network namespace than the agent's gives None."""

from __future__ import annotations

import os
import socket
import struct
from typing import Dict, List, Optional, Set, Tuple

from . import proc

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
INET_DIAG_INFO = 2
HEADER = struct.Struct("=IHHII")            # nlmsghdr
REQUEST = struct.Struct("=BBBxI48s")        # inet_diag_req_v2: family, protocol, ext, states, id
MESSAGE_QUEUES = 56                         # inet_diag_msg's idiag_rqueue, idiag_wqueue (bytes)
MESSAGE_INODE = 68                          # inet_diag_msg's idiag_inode (after family .. uid)
MESSAGE_SIZE = 72
MESSAGE_ID = 4, 52                          # inet_diag_msg's idiag_id (inet_diag_sockid: ports, addresses, cookie)
BYTES_ACKED, BYTES_RECEIVED = 120, 128      # struct tcp_info's __u64 fields (linux/tcp.h)
READ_LIMIT = 64 << 20                       # bytes of one dump read at most (a node's sockets)
WALK_EVERY = 10                             # samples: the whole table is dumped in one of so many
ASKED_AT_ONCE = 128                         # sockets asked for in one message (their answers fit the buffer)


Identity = Tuple[int, bytes]                # a socket's family and inet_diag_sockid


def _dump(family: int, ids: Optional[Dict[int, Identity]] = None,
          states: Optional[Dict[int, int]] = None) -> Optional[Dict[int, int]]:
    """socket inode -> bytes the process wrote and read through it, for every TCP socket of `family`
    in this network namespace (each one's identity into `ids`); None when the kernel does not answer."""
    out: Dict[int, int] = {}
    try:
        s = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
    except OSError:
        return None
    try:
        s.settimeout(2.0)
        body = REQUEST.pack(family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), 0xFFFFFFFF, b"\0" * 48)
        s.send(HEADER.pack(HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + body)
        read = 0
        while read < READ_LIMIT:
            data = s.recv(1 << 16)
            read += len(data)
            at = 0
            while at + HEADER.size <= len(data):
                length, kind = HEADER.unpack_from(data, at)[:2]
                if length < HEADER.size:
                    return out
                if kind == NLMSG_DONE:
                    return out
                if kind == NLMSG_ERROR:
                    return None
                _message(data[at + HEADER.size:at + length], out, ids, family, states)
                at += (length + 3) & ~3
    except OSError:
        return None
    finally:
        s.close()
    return out


def _asked(sockets: List[Identity], states: Optional[Dict[int, int]] = None) -> Optional[Dict[int, int]]:
    """inode -> bytes, as _dump, for the sockets named, each found by the kernel's lookup of its
    identity (one answer each: its message, or an error when it is gone); None when the kernel
    does not answer."""
    out: Dict[int, int] = {}
    try:
        s = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
    except OSError:
        return None
    try:
        s.settimeout(2.0)
        for first in range(0, len(sockets), ASKED_AT_ONCE):
            batch = sockets[first:first + ASKED_AT_ONCE]
            requests = []
            for seq, (family, identity) in enumerate(batch, 1):
                body = REQUEST.pack(family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), 0xFFFFFFFF, identity)
                requests.append(HEADER.pack(HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, seq, 0) + body)
            s.send(b"".join(requests))
            answered = 0
            while answered < len(batch):
                data = s.recv(1 << 16)
                at = 0
                while at + HEADER.size <= len(data):
                    length, kind = HEADER.unpack_from(data, at)[:2]
                    if length < HEADER.size:
                        return None
                    answered += 1
                    if kind == SOCK_DIAG_BY_FAMILY:
                        _message(data[at + HEADER.size:at + length], out, states=states)
                    at += (length + 3) & ~3
    except OSError:
        return None
    finally:
        s.close()
    return out


def _message(msg: bytes, out: Dict[int, int], ids: Optional[Dict[int, Identity]] = None, family: int = 0,
             states: Optional[Dict[int, int]] = None) -> None:
    if len(msg) < MESSAGE_SIZE:
        return
    inode = struct.unpack_from("=I", msg, MESSAGE_INODE)[0]
    if states is not None:
        states[inode] = msg[1]                 # idiag_state (include/net/tcp_states.h)
    if ids is not None:
        ids[inode] = (family, msg[MESSAGE_ID[0]:MESSAGE_ID[1]])
    unread, unacked = struct.unpack_from("=II", msg, MESSAGE_QUEUES)
    at = MESSAGE_SIZE
    while at + 4 <= len(msg):
        length, kind = struct.unpack_from("=HH", msg, at)
        if length < 4:
            return
        if kind == INET_DIAG_INFO and length - 4 >= BYTES_RECEIVED + 8:
            acked, received = struct.unpack_from("=QQ", msg, at + 4 + BYTES_ACKED)
            out[inode] = acked + unacked + max(0, received - unread)     # written + read by the rank
            return
        at += (length + 3) & ~3


def _inodes(pid: int) -> Optional[Set[int]]:
    """The socket inodes among its open files; None when they cannot be read."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    found: Set[int] = set()
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(int(target[8:-1]))
    return found


class Wire:
    """Read once per sample: `moved(pid, now)` reads the namespace's TCP sockets the first time
    it is asked at a new `now` (a dump in one sample of WALK_EVERY, or when a socket is new;
    otherwise the known sockets by their identity)."""

    def __init__(self) -> None:
        self.at: Optional[float] = None
        self.table: Optional[Dict[int, int]] = None   # inode -> bytes, at `at`
        self.own = proc.netns(os.getpid())
        self.ids: Dict[int, Identity] = {}           # inode -> identity, from the last dump
        self.not_tcp: Set[int] = set()               # socket inodes held at a dump and not in it (unix, UDP)
        self.samples = 0
        self.walked = False                          # the dump was read at `at`
        self.states: Dict[int, int] = {}             # inode -> its TCP state, read at `at`
        self.answered = False                        # the last dump was answered

    def _walk(self) -> None:
        ids: Dict[int, Identity] = {}
        four, six = _dump(socket.AF_INET, ids, self.states), _dump(socket.AF_INET6, ids, self.states)
        self.table = None if four is None and six is None else {**(four or {}), **(six or {})}
        self.ids, self.not_tcp, self.walked = ids, set(), True
        self.answered = self.table is not None

    def moved(self, pid: int, now: float) -> Optional[int]:
        """The bytes it has written and read through its TCP connections, summed over those open
        now; None when not known (another network namespace, no sock_diag)."""
        if self.own is None or proc.netns(pid) != self.own:
            return None
        if self.at != now:
            self.at, self.walked, self.states = now, False, {}
            self.samples += 1
            if self.samples % WALK_EVERY == 1:
                self._walk()
            else:
                self.table = {} if self.answered else None   # no sock_diag: nothing known, never 0
        inodes = _inodes(pid)
        if inodes is None:
            return None
        if self.table is not None and not self.walked and any(i not in self.ids and i not in self.not_tcp
                                                              for i in inodes):
            self._walk()                             # a socket not seen before: its identity
        if self.table is None:
            return None
        if self.walked:
            self.not_tcp |= {i for i in inodes if i not in self.ids}
        asking = [i for i in inodes if i in self.ids and i not in self.table]
        if asking:
            answers = _asked([self.ids[i] for i in asking], self.states)
            if answers is None:
                return None
            self.table.update(answers)
            for i in asking:
                self.table.setdefault(i, 0)          # gone from the kernel's tables: it moves nothing
        return sum(self.table.get(i, 0) for i in inodes)

    def states_of(self, pid: int, now: float) -> Optional[Dict[int, int]]:
        """Its TCP sockets' states at `now` ({inode: state}, as the kernel numbers them), read with
        its bytes; None when not known."""
        if self.moved(pid, now) is None:
            return None
        inodes = _inodes(pid) or set()
        return {i: self.states[i] for i in inodes if i in self.states}
