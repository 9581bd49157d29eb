"""What /proc says about processes and this machine: read once, here, for the collectors and the
agent alike. Every function returns None (or an empty value) for a process that is gone."""

from __future__ import annotations

import ipaddress
import os
import signal
import stat as stat_module
import time
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Set

TICK = os.sysconf("SC_CLK_TCK")     # clock ticks per second, the unit of /proc's times


def read(path: str, default: Optional[str] = None) -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return default


def read_bytes(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


@dataclass(frozen=True)
class Stat:
    state: str                 # R, S, D, Z, ... as in ps
    ppid: int
    cpu_seconds: float         # user + system, the whole process
    start_ticks: int           # since boot, in TICKs: with the pid, names the process for its life
    exit_status: Optional[int]  # the wait status, readable while it is a zombie (Linux 3.5+)
    flags: int = 0             # the kernel's PF_* flags of its first thread (PF_EXITING: on its way out)
    pending: int = 0           # signals pending for its first thread, a bitmap (bit n-1: signal n)
    children_seconds: float = 0.0   # user + system of its children it has waited for (and theirs)

    @property
    def start_seconds(self) -> float:
        return self.start_ticks / TICK

    @property
    def leaving(self) -> bool:
        """On its way out: exiting, or killed (SIGKILL pending: the OOM killer's kill shows here the
        moment it is sent, before the process acts on it)."""
        return bool(self.flags & PF_EXITING or self.pending & (1 << (signal.SIGKILL - 1)))


PF_EXITING = 0x4            # include/linux/sched.h: set as the process starts to exit (a signal, exit())


def stat(pid: int) -> Optional[Stat]:
    """/proc/PID/stat, parsed; None when the process is gone. The one reader of that file: the
    agent, the rank finder, the exit-code reader, the lab and the benchmarks all call it."""
    raw = read_bytes(f"/proc/{pid}/stat")
    return parse_stat(raw) if raw else None


def parse_stat(raw: bytes) -> Stat:
    """One /proc/PID/stat line. The command name may hold spaces and parentheses: the fields
    start after the last ')' (proc(5) numbers them from 1: state is field 3)."""
    fields = raw[raw.rindex(b")") + 2:].split()
    return Stat(fields[0].decode(), int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK, int(fields[19]),
                int(fields[49]) if len(fields) > 49 else None, int(fields[6]), int(fields[28]),
                (int(fields[13]) + int(fields[14])) / TICK)


def pids() -> Iterator[int]:
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def threads(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


def maps_library(pid: int, name: str) -> bool:
    """Whether a shared library of this file name is mapped in the process (/proc/PID/maps, which
    the kernel writes: nothing of the process's own is followed). False when it is gone or not
    readable."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            wanted = b"/" + name.encode()
            return any(line.rstrip().endswith(wanted) for line in f)
    except OSError:
        return False


def environ(pid: int) -> Optional[Dict[str, str]]:
    """The environment it started with; None when this user may not read it (another user's
    process), {} when it is gone or has none (a kernel thread)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except PermissionError:
        return None
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def cmdline(pid: int) -> List[str]:
    raw = read_bytes(f"/proc/{pid}/cmdline") or b""
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def netns(pid: int) -> Optional[str]:
    """Its network namespace ("net:[4026531840]"); None when this user may not tell."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def uid(pid: int) -> Optional[int]:
    """Its effective uid (the owner of what it creates)."""
    for line in (read(f"/proc/{pid}/status") or "").splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[2])
    return None


def tracer(pid: int) -> Optional[int]:
    """The pid of the process that ptrace-traces it (a debugger, strace, a py-spy record), or None."""
    for line in (read(f"/proc/{pid}/status") or "").splitlines():
        if line.startswith("TracerPid:"):
            value = line.split()[1:2]
            return int(value[0]) if value and value[0].isdigit() and int(value[0]) > 0 else None
    return None


def owner(pid: int) -> Optional[int]:
    """The uid that owns its /proc entry (its real owner, for ps-like listings)."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def wchan(pid: int) -> Optional[str]:
    """The kernel function it sleeps in, when it sleeps."""
    text = (read(f"/proc/{pid}/wchan") or "").strip()
    return text if text and text != "0" else None


def boot_time() -> float:
    """When this machine booted, epoch seconds (/proc/stat's btime): a process started at
    boot_time() + start_ticks / TICK."""
    for line in (read("/proc/stat") or "").splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return time.time() - uptime()


def io_bytes(pid: int) -> Optional[int]:
    """Bytes it read and wrote through system calls (sockets, pipes, files: /proc/PID/io's rchar +
    wchar); None when this user may not read it or it is gone."""
    text = read(f"/proc/{pid}/io")
    if not text:
        return None
    fields = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
    try:
        return int(fields["rchar"]) + int(fields["wchar"])
    except (KeyError, ValueError):
        return None


def oom_kills() -> Optional[int]:
    """How many processes the kernel's OOM killer has killed since boot (/proc/vmstat's oom_kill,
    Linux 4.13+); None where it is not counted."""
    for line in (read("/proc/vmstat") or "").splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return None


def reverse_path_drops() -> Optional[int]:
    """How many packets this network namespace's reverse-path filter has dropped since it began
    (/proc/net/netstat's TcpExt IPReversePathFilter: a packet that arrived on another interface
    than the one the route back to its sender uses, under a strict rp_filter); None where it is
    not counted. ARP requests it turns away are not counted there."""
    lines = (read("/proc/net/netstat") or "").splitlines()
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:") and values.startswith("TcpExt:"):
            fields = dict(zip(names.split()[1:], values.split()[1:]))
            try:
                return int(fields["IPReversePathFilter"])
            except (KeyError, ValueError):
                return None
    return None


def uptime() -> float:
    text = read("/proc/uptime", "0 0") or "0 0"
    return float(text.split()[0])


def net_bytes() -> int:
    """Received + sent bytes of every interface but loopback, in this network namespace."""
    total = 0
    for line in (read("/proc/net/dev") or "").splitlines()[2:]:
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            continue
        fields = rest.split()
        total += int(fields[0]) + int(fields[8])
    return total


def socket_inodes(pid: int) -> Optional[Set[int]]:
    """The inodes of the sockets it holds open; None when this user may not list its files
    (another user's process) or it is gone."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    inodes = set()
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue            # closed since the listing
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


ESTABLISHED = "01"          # /proc/net/tcp's state column (include/net/tcp_states.h)
TIME_WAIT = "06"            # the side that closed first holds it, for 60 s (TCP_TIMEWAIT_LEN)
CLOSE_WAIT = "08"           # the peer closed; this side has not yet


@dataclass(frozen=True)
class TcpSocket:
    local: str                 # "10.0.0.1:29500" (an IPv4 address mapped into IPv6 is written as IPv4)
    remote: str
    state: str                 # the kernel's state, as /proc/net/tcp writes it ("01": established)
    unsent: int                # tx_queue: bytes sent, not yet acknowledged
    unread: int                # rx_queue: bytes arrived, not yet read
    inode: int                 # 0 when no process holds it (TIME_WAIT)


def tcp_table(pid: int) -> List[TcpSocket]:
    """Every TCP socket in its network namespace (IPv4 and IPv6), read once."""
    return tcp_table_read(pid) or []


def tcp_table_read(pid: int) -> Optional[List[TcpSocket]]:
    """tcp_table, or None when its IPv4 table could not be read (the process is gone): never
    an empty table to stand for its namespace's."""
    found: List[TcpSocket] = []
    for table in ("tcp", "tcp6"):
        text = read(f"/proc/{pid}/net/{table}")
        if text is None and table == "tcp":
            return None
        for line in (text or "").splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10:
                continue
            tx, _, rx = fields[4].partition(":")
            try:
                found.append(TcpSocket(_endpoint(fields[1]), _endpoint(fields[2]), fields[3], int(tx, 16), int(rx, 16),
                                       int(fields[9])))
            except ValueError:
                continue
    return found


def _endpoint(text: str) -> str:
    """/proc/net/tcp's "0100007F:7530" (or 32 hex digits for IPv6) as "127.0.0.1:30000"."""
    address, _, port = text.partition(":")
    raw = bytes.fromhex(address)
    if len(raw) == 4:
        host = ".".join(str(b) for b in raw[::-1])
    else:
        words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))      # each 32-bit word in host order
        if words[:12] == b"\0" * 10 + b"\xff\xff":
            host = ".".join(str(b) for b in words[12:])
        else:
            host = f"[{ipaddress.IPv6Address(words).compressed}]"      # as Gloo's messages write it
    return f"{host}:{int(port, 16)}"


def tcp_sockets(pid: int) -> Set[int]:
    """The inodes of every TCP socket a process holds, in any state, in its network namespace."""
    return {s.inode for s in tcp_table(pid) if s.inode}


def tcp_established(pid: int) -> Set[int]:
    """The inodes of the established TCP sockets (IPv4 and IPv6) in its network namespace."""
    return {s.inode for s in tcp_table(pid) if s.state == ESTABLISHED}


def output_files(pid: int) -> Set[tuple]:
    """(device, inode) of its stdout and stderr where they are regular files (stat through its
    /proc entry: nothing is opened): the same pair on two processes is one file they both write,
    whose lines are each one's only where a prefix says so (`[rank3]: `)."""
    found = set()
    for n in (1, 2):
        try:
            st = os.stat(f"/proc/{pid}/fd/{n}")
        except OSError:
            continue
        if stat_module.S_ISREG(st.st_mode):
            found.add((st.st_dev, st.st_ino))
    return found
