"""Runs ON a node (standard library only, under the supervisor; its spec and token come on
stdin, never in argv): the path-MTU probe, echo or probe.

echo:  bind a UDP socket on `address` port 0 (the kernel picks from the ephemeral range);
       print READY {"port", "interface", "mtu"}; answer every datagram that starts with
       `token` with 8 bytes: its id and the size it arrived with; on SIGTERM print RESULT
       {"answered", "rejected"}.
probe: toward every target at once, from `address`: the largest IP packet that reaches the
       target's echo with don't-fragment set, and the MTU the kernel holds for the route;
       print RESULT [...], one entry per target.

Why UDP with IP_PMTUDISC_DO: it needs no privilege (raw sockets and scapy need CAP_NET_RAW,
ping sockets need net.ipv4.ping_group_range), each direction is measured on its own (the echo
answers with 8 bytes, which any path carries), and it goes from Gloo's address to Gloo's
address. A hop that drops large frames without an ICMP reply (a switch port or VLAN at 1500
between jumbo-frame hosts) is the black hole TCP never recovers from: the large sizes are
simply never answered. A hop that does answer with ICMP "fragmentation needed" teaches the
kernel the path's MTU (IP_MTU drops, send() says EMSGSIZE): TCP adapts to that one.

The search sends many sizes at once (a lost size costs one wait, not one per size): first the
route's full size and a small one; if the full size is lost, rounds of sizes spread between the
largest answered and the smallest lost until they are one byte apart, then the smallest lost is
sent again three times before it is believed. An answer that comes late still counts."""

import errno
import hmac
import signal
import socket
import struct
import threading
import time

from . import protocol
from .protocol import READY, RESULT

# Linux's values, where this Python's socket module does not name them.
IP_MTU_DISCOVER = getattr(socket, "IP_MTU_DISCOVER", 10)
IP_PMTUDISC_DO = getattr(socket, "IP_PMTUDISC_DO", 2)
IP_MTU = getattr(socket, "IP_MTU", 14)
IPV6_MTU_DISCOVER = getattr(socket, "IPV6_MTU_DISCOVER", 23)
IPV6_PMTUDISC_DO = getattr(socket, "IPV6_PMTUDISC_DO", 2)
IPV6_MTU = getattr(socket, "IPV6_MTU", 24)

HEADERS = {socket.AF_INET: 28, socket.AF_INET6: 48}   # IP and UDP headers: a size here is the IP packet's
FLOOR = {socket.AF_INET: 576, socket.AF_INET6: 1280}  # every path carries these (RFC 791, RFC 8200)
SPREAD = 8              # sizes per round: few enough that the echo's receive buffer holds a round
FIRST_WAIT = 0.5        # seconds for the first answer of a target (none yet: no round-trip time known)
MIN_WAIT = 0.03         # after the round-trip time is known: max(this, 4 x the shortest one)
CONFIRM_WAIT = 0.2      # the smallest lost size, sent three times, gets this long before it is believed
MAX_ROUNDS = 12
ANSWER = struct.Struct("!II")   # id, the size it arrived with


def family(address):
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def interface_mtu(interface):
    try:
        with open(f"/sys/class/net/{interface}/mtu") as f:
            return int(f.read().strip())
    except (OSError, ValueError, TypeError):
        return None


def echo(spec):
    address, token = spec["address"], bytes.fromhex(spec["token"])
    sock = socket.socket(family(address), socket.SOCK_DGRAM)
    try:
        sock.bind((address, 0))
    except OSError as exc:
        protocol.emit(READY, {"error": f"cannot bind UDP on {address}: {exc.strerror}",
                              "errno": errno.errorcode.get(exc.errno)})
        sock.close()
        return
    try:   # a round of large sizes from several nodes at once must fit (capped by net.core.rmem_max)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    except OSError:
        pass
    interface = spec.get("interface")
    protocol.emit(READY, {"port": sock.getsockname()[1], "interface": interface, "mtu": interface_mtu(interface)})
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stats = {"answered": 0, "rejected": 0}
    sock.settimeout(0.1)
    until = time.monotonic() + spec.get("duration", 30)
    try:
        while not stop.is_set() and time.monotonic() < until:
            try:
                data, peer = sock.recvfrom(65535)
            except socket.timeout:
                continue
            except OSError:
                continue
            if len(data) < len(token) + 4 or not hmac.compare_digest(data[:len(token)], token):
                stats["rejected"] += 1      # not ours: never answered
                continue
            (ident,) = struct.unpack_from("!I", data, len(token))
            try:
                sock.sendto(ANSWER.pack(ident, len(data) + HEADERS[sock.family]), peer)
                stats["answered"] += 1
            except OSError:
                pass
    finally:
        sock.close()
        protocol.emit(RESULT, stats)


class Search:
    """One target: what was sent (id -> size), what came back, and the bounds they give."""

    def __init__(self, sock, token, route_mtu, fam):
        self.sock, self.token, self.fam = sock, token, fam
        self.route_mtu = route_mtu
        self.sent = {}            # id -> size
        self.answered = set()     # sizes answered
        self.tried = set()        # sizes sent
        self.refused = None       # the smallest size send() refused (EMSGSIZE: the kernel knows a smaller MTU)
        self.blocked = None       # the smallest size send() refused with EPERM: this node's own firewall
                                  # (a netfilter output rule dropped it: the kernel says so to the sender)
        self.rtt = None           # the shortest round trip seen, seconds
        self.times = {}           # id -> when sent
        self.next_id = 1
        self.rounds = 0
        self.port_refused = False  # ICMP port unreachable: nothing listens there (the echo is gone)

    @property
    def good(self):
        return max(self.answered) if self.answered else None

    def bad(self):
        """The smallest size known not to pass: never answered, or refused by the kernel."""
        good = self.good or 0
        lost = [s for s in self.tried if s > good and s not in self.answered]
        lost += [s for s in (self.refused, self.blocked) if s is not None]
        return min(lost) if lost else None

    def send(self, size):
        ident, self.next_id = self.next_id, self.next_id + 1
        payload = self.token + struct.pack("!I", ident)
        payload += b"\0" * (size - HEADERS[self.fam] - len(payload))
        self.tried.add(size)
        try:
            try:
                self.sock.send(payload)
            except ConnectionRefusedError:      # an earlier ICMP port unreachable, reported now
                self.port_refused = True
                self.sock.send(payload)
        except OSError as exc:
            if exc.errno == errno.ECONNREFUSED:
                self.port_refused = True
                self.tried.discard(size)
                return
            if exc.errno == errno.EPERM:
                self.blocked = size if self.blocked is None else min(self.blocked, size)
                self.tried.discard(size)
                return
            if exc.errno != errno.EMSGSIZE:
                raise
            self.refused = size if self.refused is None else min(self.refused, size)
            self.tried.discard(size)
            return
        self.sent[ident] = size
        self.times[ident] = time.monotonic()

    def receive(self, sent_at, wait=None):
        """Answers until every size sent has its answer, or the wait after `sent_at` is over: `wait`
        if given, else FIRST_WAIT until a round trip is known, then 4 round trips (MIN_WAIT at least)."""
        while not self.all_answered():
            limit = wait if wait is not None else FIRST_WAIT if self.rtt is None else max(MIN_WAIT, 4 * self.rtt)
            left = sent_at + limit - time.monotonic()
            if left <= 0:
                return
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(64)
            except socket.timeout:
                return
            except ConnectionRefusedError:
                self.port_refused = True    # ICMP port unreachable: read on until the wait is over
                continue
            except OSError:
                continue
            if len(data) != ANSWER.size:
                continue
            ident, _ = ANSWER.unpack(data)
            if ident in self.sent:
                self.answered.add(self.sent[ident])
                rtt = time.monotonic() - self.times[ident]
                self.rtt = rtt if self.rtt is None else min(self.rtt, rtt)

    def all_answered(self):
        return all(s in self.answered for s in self.sent.values())

    def round(self, sizes, wait=None):
        self.rounds += 1
        for size in sorted(sizes):
            self.send(size)
        self.receive(time.monotonic(), wait)


def spread(low, high, count):
    """Up to `count` sizes strictly between low and high, evenly spaced, the highest first in mind."""
    inside = high - low - 1
    if inside <= 0:
        return []
    if inside <= count:
        return list(range(low + 1, high))
    step = (high - low) / (count + 1)
    return sorted({int(low + step * (k + 1)) for k in range(count)})


def measure(target, address, token, timeout):
    """The largest DF packet that reaches one target's echo, and what the kernel says of the route."""
    started = time.monotonic()
    out = {"dst": target["dst"], "address": target["address"], "port": target["port"]}
    fam = family(target["address"])
    sock = socket.socket(fam, socket.SOCK_DGRAM)
    level, discover, do, mtu_opt = ((socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO, IP_MTU)
                                    if fam == socket.AF_INET else
                                    (socket.IPPROTO_IPV6, IPV6_MTU_DISCOVER, IPV6_PMTUDISC_DO, IPV6_MTU))
    try:
        sock.setsockopt(level, discover, do)     # don't fragment; never fall back to fragments
        if address:
            sock.bind((address, 0))
        sock.connect((target["address"], target["port"]))
        route_mtu = sock.getsockopt(level, mtu_opt)
        out["route_mtu"] = route_mtu
        search = Search(sock, token, route_mtu, fam)
        floor = min(FLOOR[fam], route_mtu)
        deadline = started + timeout
        search.round([floor, route_mtu])
        if search.good is None:
            search.round([floor, route_mtu], wait=FIRST_WAIT)      # once more: a lost packet, not a path
        while search.good is not None and time.monotonic() < deadline and search.rounds < MAX_ROUNDS:
            bad = search.bad()
            if bad is None:
                break                           # the route's full size passed
            between = spread(search.good, bad, SPREAD)
            if between:
                search.round(between)
                continue
            # One byte apart: believe the smallest lost size only after three more tries.
            search.round([bad] * 3, wait=CONFIRM_WAIT)
            if search.bad() == bad and bad not in search.answered:
                break
        out.update(passed=search.good, lost=search.bad(), refused=search.refused, blocked=search.blocked,
                   learned_mtu=sock.getsockopt(level, mtu_opt), rtt_ms=None if search.rtt is None
                   else round(search.rtt * 1000, 3), sent=search.next_id - 1, rounds=search.rounds,
                   port_refused=search.port_refused)
        out["outcome"] = ("blocked-here" if search.blocked is not None else
                          "unanswered" if search.good is None else
                          "fits" if search.good >= route_mtu else
                          "learned" if out["learned_mtu"] < route_mtu or search.refused is not None else
                          "blackhole")
    except OSError as exc:
        out.update(outcome="error", detail=f"{errno.errorcode.get(exc.errno, exc.errno)}: {exc.strerror}")
    finally:
        sock.close()
    out["seconds"] = round(time.monotonic() - started, 3)
    return out


def probe(spec):
    token = bytes.fromhex(spec["token"])
    targets = spec["targets"]
    results = [None] * len(targets)

    def one(i):
        results[i] = measure(targets[i], spec.get("address"), token, spec.get("timeout", 5.0))
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(targets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    protocol.emit(RESULT, {"interface": spec.get("interface"), "mtu": interface_mtu(spec.get("interface")),
                           "pairs": results})


def main(spec, work=None):
    {"echo": echo, "probe": probe}[spec["mode"]](spec)
    return 0
