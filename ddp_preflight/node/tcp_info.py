"""What the kernel counts of a process's own TCP connections (TCP_INFO, per socket): the bytes and
data segments it sent, the segments it sent again, how many of those the peer reported as
duplicates (D-SACK: spurious, the first copy had arrived: reordering or a late ACK on a busy
host, not loss), and the smoothed round trip. Lost = sent again - spurious. Read inside the
process (a rank of a probe job), from its descriptors: Gloo's pair sockets are the rank's own,
though Python never opened them. Linux 4.20+ (tcpi_bytes_sent, tcpi_dsack_dups); an older kernel
gives nothing, never a wrong figure. On a busy 2-core box two local ranks' loopback connection
sent 42 of 11469 segments again, and the peer reported 42 of them as duplicates: 0 lost."""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass

# struct tcp_info (linux/tcp.h): the offsets of the fields read here.
UNACKED = 24              # __u32 tcpi_unacked, data segments sent and not yet acknowledged: in flight
RTT_US = 68               # __u32 tcpi_rtt, microseconds
TOTAL_RETRANS = 100       # __u32 tcpi_total_retrans, segments
DATA_SEGS_OUT = 156       # __u32 tcpi_data_segs_out
BUSY_TIME = 168           # __u64 tcpi_busy_time, microseconds it had data to send (4.10+)
DELIVERED = 192           # __u32 tcpi_delivered, data segments the peer acknowledged (4.18+)
DSACK_DUPS = 216          # __u32 tcpi_dsack_dups (4.20+)
BYTES_SENT = 200          # __u64 tcpi_bytes_sent (4.19+)
BYTES_RETRANS = 208       # __u64 tcpi_bytes_retrans (4.19+)
WANTED = 220


@dataclass(frozen=True)
class Connection:
    local: str            # its own address
    peer: str             # the other end's address
    sent: int             # bytes sent, retransmissions included
    retrans: int          # bytes sent again
    rtt_us: int           # the kernel's smoothed round trip
    segs: int = 0         # data segments sent
    resent: int = 0       # segments sent again
    spurious: int = 0     # of those, reported by the peer as duplicates (D-SACK)
    busy_us: int = 0      # microseconds it had data in flight or queued: sent / busy is its throughput
    delivered: int = 0    # data segments the peer acknowledged: sent less delivered less spurious is lost,
                          # also where the sender's own firewall dropped them (the kernel counts no resend then)
    unacked: int = 0      # data segments in flight at the reading: sent, not yet acknowledged, not lost


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
                             struct.unpack_from("Q", raw, BYTES_RETRANS)[0], struct.unpack_from("I", raw, RTT_US)[0],
                             struct.unpack_from("I", raw, DATA_SEGS_OUT)[0],
                             struct.unpack_from("I", raw, TOTAL_RETRANS)[0],
                             struct.unpack_from("I", raw, DSACK_DUPS)[0], struct.unpack_from("Q", raw, BUSY_TIME)[0],
                             struct.unpack_from("I", raw, DELIVERED)[0], struct.unpack_from("I", raw, UNACKED)[0])
    return out


def moved(before: dict[int, Connection], after: dict[int, Connection]) -> list[dict]:
    """What each connection sent between two readings, summed per (local, peer) address pair:
    [{"local", "peer", "sent", "retrans", "rtt_us", "segs", "lost", "busy_us"}] (bytes sent and
    sent again, the largest round trip, data segments sent, segments lost: sent again less those
    the peer reported as duplicates, the time its busiest socket had data to send). A connection
    opened in between counts from nothing."""
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
                                                        "retrans": 0, "rtt_us": 0, "segs": 0, "lost": 0,
                                                        "busy_us": 0, "undelivered": 0})
        pair["sent"] += sent
        pair["retrans"] += max(0, retrans)
        pair["rtt_us"] = max(pair["rtt_us"], now.rtt_us)
        pair["segs"] += max(0, now.segs - (then.segs if then else 0))
        resent = now.resent - (then.resent if then else 0)
        spurious = now.spurious - (then.spurious if then else 0)
        pair["lost"] += max(0, resent - spurious)
        segs = now.segs - (then.segs if then else 0)
        delivered = now.delivered - (then.delivered if then else 0)
        # Segments still in flight at the second reading (sent, their ACK not back yet: the last of
        # an all_reduce behind a slow link's 100 ms queue) are not lost; those in flight at the
        # first were delivered in between. Counting them lost named a slow node's sender as
        # dropping what it sends, under load (its ACKs later still).
        in_flight = now.unacked - (then.unacked if then else 0)
        pair["undelivered"] += max(0, segs - delivered - spurious - in_flight)
        # Its sockets send side by side: the pair was busy as long as its busiest one.
        pair["busy_us"] = max(pair["busy_us"], now.busy_us - (then.busy_us if then else 0))
    return sorted(pairs.values(), key=lambda p: (p["local"], p["peer"]))


def _plain(address: str) -> str:
    """An IPv4 peer of a dual-stack socket as itself (::ffff:10.0.0.1 -> 10.0.0.1)."""
    return address[7:] if address.startswith("::ffff:") and "." in address else address
