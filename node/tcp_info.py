"""What the kernel counts of a process's own TCP connections (TCP_INFO, per socket): the bytes it
sent, the bytes it sent again (retransmitted: lost on the way, or their acknowledgement was), and
the smoothed round trip. Read inside the process (a rank of a probe job), from its descriptors:
Gloo's pair sockets are the rank's own, though Python never opened them. Linux 4.19+ (tcpi_bytes_sent
and tcpi_bytes_retrans); an older kernel gives nothing, never a wrong figure."""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass

# struct tcp_info (linux/tcp.h): the offsets of the fields read here.
RTT_US = 68               # __u32 tcpi_rtt, microseconds
BYTES_SENT = 200          # __u64 tcpi_bytes_sent (4.19+)
BYTES_RETRANS = 208       # __u64 tcpi_bytes_retrans (4.19+)
WANTED = 216


@dataclass(frozen=True)
class Connection:
    local: str            # its own address
    peer: str             # the other end's address
    sent: int             # bytes sent, retransmissions included
    retrans: int          # bytes sent again
    rtt_us: int           # the kernel's smoothed round trip


def connections(proc_fd: str = "/proc/self/fd") -> dict[int, Connection]:
    """This process's connected TCP sockets, by descriptor."""
    out: dict[int, Connection] = {}
    try:
        fds = os.listdir(proc_fd)
    except OSError:
        return out
    for name in fds:
        try:
            fd = int(name)
            if not os.readlink(f"{proc_fd}/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(fd))
        except (ValueError, OSError):
            continue
        try:
            if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
            local, peer = sock.getsockname()[0], sock.getpeername()[0]
        except OSError:            # listening, or not connected
            continue
        finally:
            sock.close()           # the duplicate only
        if len(raw) < WANTED:
            continue
        out[fd] = Connection(_plain(local), _plain(peer), struct.unpack_from("Q", raw, BYTES_SENT)[0],
                             struct.unpack_from("Q", raw, BYTES_RETRANS)[0], struct.unpack_from("I", raw, RTT_US)[0])
    return out


def moved(before: dict[int, Connection], after: dict[int, Connection]) -> list[dict]:
    """What each connection sent between two readings, summed per (local, peer) address pair:
    [{"local", "peer", "sent", "retrans", "rtt_us"}] (rtt_us: the largest). A connection opened
    in between counts from nothing."""
    pairs: dict[tuple[str, str], dict] = {}
    for fd, now in after.items():
        then = before.get(fd)
        if then is not None and (then.local, then.peer) != (now.local, now.peer):
            then = None            # the descriptor was reused
        sent = now.sent - (then.sent if then else 0)
        retrans = now.retrans - (then.retrans if then else 0)
        if sent <= 0:
            continue
        pair = pairs.setdefault((now.local, now.peer), {"local": now.local, "peer": now.peer, "sent": 0,
                                                        "retrans": 0, "rtt_us": 0})
        pair["sent"] += sent
        pair["retrans"] += max(0, retrans)
        pair["rtt_us"] = max(pair["rtt_us"], now.rtt_us)
    return sorted(pairs.values(), key=lambda p: (p["local"], p["peer"]))


def _plain(address: str) -> str:
    """An IPv4 peer of a dual-stack socket as itself (::ffff:10.0.0.1 -> 10.0.0.1)."""
    return address[7:] if address.startswith("::ffff:") and "." in address else address
