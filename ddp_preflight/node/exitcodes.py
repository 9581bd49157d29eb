"""Every process's wait status as it exits, from the kernel's taskstats (a generic netlink family,
Linux 2.6.19+). Standard library only.

Why: a rank's exit code is read from /proc/PID/stat while it is a zombie, and its parent
(torchrun polls its ranks every 0.1 s) may reap it before the agent reads: then its code is gone.
Under load on the lab's 2 cores that happened to 1 exit in 10 and 3 clean exits in 5. The kernel
sends taskstats' exit record (with `ac_exitcode`, the wait status) to every registered listener
from do_exit, before the process becomes a zombie, so the record is queued on our socket by the
time its pidfd says it ended; nothing races.

The kernel sends these records in the first network namespace only, so the socket is made
there (setns to /proc/1/ns/net and back; the lab's nodes and most hosts share the first pid
namespace). Registering a listener needs CAP_NET_ADMIN: without it, or without taskstats, the
agent reads the zombie's stat alone, as before (`start()` says why not).

    codes = ExitCodes()
    why_not = codes.start()          # None: listening
    ...
    codes.status(pid)                # the wait status of pid's exit, or None
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from collections import OrderedDict
from typing import Dict, Iterable, Optional, Tuple

from .proc import stat

NETLINK_GENERIC = 16
GENL_ID_CTRL = 0x10
CTRL_CMD_GETFAMILY = 3
CTRL_ATTR_FAMILY_ID = 1
CTRL_ATTR_FAMILY_NAME = 2
TASKSTATS_CMD_GET = 1
TASKSTATS_CMD_ATTR_REGISTER_CPUMASK = 3
TASKSTATS_TYPE_PID = 1
TASKSTATS_TYPE_STATS = 3
TASKSTATS_TYPE_AGGR_PID = 4
NLMSG_ERROR = 2
NLM_F_REQUEST, NLM_F_ACK = 1, 4
KEPT = 4096                 # exits remembered: the newest, any process (the agent asks about its ranks)
RCVBUF = 4 << 20            # room for bursts of exits between two drains (a record is about 400 bytes)


def _attr(kind: int, data: bytes) -> bytes:
    length = 4 + len(data)
    return struct.pack("HH", length, kind) + data + b"\0" * (-length % 4)


def _attrs(buf: bytes) -> Dict[int, list]:
    out: Dict[int, list] = {}
    i = 0
    while i + 4 <= len(buf):
        length, kind = struct.unpack_from("HH", buf, i)
        if length < 4:
            break
        out.setdefault(kind & 0x3FFF, []).append(buf[i + 4:i + length])
        i += (length + 3) & ~3
    return out


def _messages(data: bytes) -> Iterable[Tuple[int, bytes]]:
    """(type, payload after the netlink header) of each message in one datagram."""
    i = 0
    while i + 16 <= len(data):
        length, kind = struct.unpack_from("IH", data, i)
        if length < 16:
            break
        yield kind, data[i + 16:i + length]
        i += (length + 3) & ~3


def exits_in(data: bytes, family: int) -> Iterable[Tuple[int, int]]:
    """(pid, wait status) of each task's exit record in one datagram: a thread's own record; a
    process's main thread has the process's pid."""
    for kind, payload in _messages(data):
        if kind != family:
            continue
        for aggregate in _attrs(payload[4:]).get(TASKSTATS_TYPE_AGGR_PID, []):
            inner = _attrs(aggregate)
            if TASKSTATS_TYPE_PID in inner and TASKSTATS_TYPE_STATS in inner:
                pid = struct.unpack_from("I", inner[TASKSTATS_TYPE_PID][0])[0]
                # struct taskstats: u16 version, then (aligned) u32 ac_exitcode
                status = struct.unpack_from("I", inner[TASKSTATS_TYPE_STATS][0], 4)[0]
                yield pid, status


class ExitCodes:
    def __init__(self) -> None:
        self.sock: Optional[socket.socket] = None
        self.family = 0
        self.seen: "OrderedDict[int, int]" = OrderedDict()

    def start(self) -> Optional[str]:
        """Listen; None when listening, else why not (the agent goes on without)."""
        try:
            sock = _socket_in_first_netns()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
            sock.bind((0, 0))
            sock.settimeout(2.0)
            self.family = _family(sock)
            online = (_read("/sys/devices/system/cpu/online") or f"0-{(os.cpu_count() or 1) - 1}").strip()
            _request(sock, self.family, TASKSTATS_CMD_GET,
                     _attr(TASKSTATS_CMD_ATTR_REGISTER_CPUMASK, online.encode() + b"\0"), ack=True)
            _acked(sock)
            sock.setblocking(False)
        except (OSError, ValueError) as exc:
            return f"taskstats: {exc}"
        self.sock = sock
        return None

    def drain(self) -> None:
        """Take every exit record queued on the socket."""
        if self.sock is None:
            return
        while True:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:      # the kernel dropped records: those exits stay unknown
                    continue
                return
            try:
                found = list(exits_in(data, self.family))
            except struct.error:        # a record shorter than its header says: skip it, keep listening
                continue
            for pid, status in found:
                self.seen[pid] = status
                self.seen.move_to_end(pid)
                while len(self.seen) > KEPT:
                    self.seen.popitem(last=False)

    def status(self, pid: int) -> Optional[int]:
        """The wait status pid exited with, if the kernel said so (drains first)."""
        self.drain()
        return self.seen.get(pid)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


PROC_NET_INIT_INO = 0xEFFFFFF9    # the first network namespace's inode number, fixed by the kernel
CLONE_NEWNET = 0x40000000


def _socket_in_first_netns() -> socket.socket:
    """A generic netlink socket in the first network namespace, where taskstats speaks: made
    here when this process is in it, else after a setns into it (this thread, for the one call)
    through the first process whose namespace is that one and readable: pid 1, else an ancestor
    (a lab node's agent descends from processes of the host's namespace)."""
    if _netns_inode("self") == PROC_NET_INIT_INO:
        return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC)
    for pid in [1, *_ancestors()]:
        if _netns_inode(str(pid)) != PROC_NET_INIT_INO:
            continue
        try:
            first = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
        except OSError:
            continue
        mine = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            _setns(first)
            try:
                return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC)
            finally:
                _setns(mine)
        finally:
            os.close(first)
            os.close(mine)
    raise OSError(errno.EACCES, "the first network namespace, where the kernel sends exit records, "
                  "is not reachable from here")


def _setns(fd: int) -> None:
    """setns(2) for this thread (os.setns is Python 3.12+)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _netns_inode(pid: str) -> Optional[int]:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def _ancestors() -> Iterable[int]:
    pid = os.getppid()
    while pid > 1:
        yield pid
        found = stat(pid)
        if found is None:
            return
        pid = found.ppid


def _request(sock: socket.socket, kind: int, command: int, payload: bytes, ack: bool = False) -> None:
    """One request; `ack`: the kernel answers with an ACK (or the error) alone."""
    body = struct.pack("BBH", command, 1, 0) + payload
    flags = NLM_F_REQUEST | (NLM_F_ACK if ack else 0)
    sock.send(struct.pack("IHHII", 16 + len(body), kind, flags, 1, 0) + body)


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _acked(sock: socket.socket) -> bytes:
    """The answer to a request; an error as OSError."""
    data = sock.recv(65536)
    for kind, payload in _messages(data):
        if kind == NLMSG_ERROR:
            code = struct.unpack_from("i", payload)[0]
            if code:
                raise OSError(-code, os.strerror(-code))
    return data


def _family(sock: socket.socket) -> int:
    _request(sock, GENL_ID_CTRL, CTRL_CMD_GETFAMILY, _attr(CTRL_ATTR_FAMILY_NAME, b"TASKSTATS\0"))
    data = _acked(sock)
    for kind, payload in _messages(data):
        if kind == GENL_ID_CTRL:
            found = _attrs(payload[4:]).get(CTRL_ATTR_FAMILY_ID)
            if found:
                return struct.unpack_from("H", found[0])[0]
    raise ValueError("the kernel has no taskstats")
