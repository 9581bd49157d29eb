"""Runs ON a node (standard library only, under the supervisor; its spec and token come on
stdin, never in argv): listen or connect.

listen:  bind `count` sockets on `address` port 0 (the kernel picks from the ephemeral range,
         as Gloo's listener does) or on fixed `ports`; pick `closed` free ports in the range;
         print READY {...}; accept only connections that present `token` within 2 s (others
         are closed and counted; all are served at once, so idle ones hold up no one); on
         SIGTERM print RESULT {...}, with how many packets the node's reverse-path filter
         dropped while it listened (the kernel's IPReversePathFilter, None where not counted).
connect: try every target at once, print RESULT [...]: open (token answered), refused (RST:
         nothing listens, no firewall), rejected (ICMP or a REJECT rule), filtered (silently
         dropped until the timeout: a firewall), unreachable (no route), error; each with the
         node's own route to the target's address (`route`: as the facts' route_to_master), read
         once an address: where a path is dropped, the cause can be this node's route; a
         target given by name says where the name came from here (`hosts_line`: the line of
         /etc/hosts that maps it, or None: another source, DNS)."""

import errno
import hmac
import ipaddress
import random
import selectors
import signal
import socket
import struct
import threading
import time

from . import protocol
from .facts.network import route_to
from .proc import reverse_path_drops
from .protocol import READY, RESULT

TOKEN_SECONDS = 2.0      # a connection has this long to present the token


def family(address):
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def free_closed_ports(address, count, low, high):
    ports = []
    for _ in range(200):
        if len(ports) >= count:
            break
        port = random.randint(low, high)
        probe = socket.socket(family(address), socket.SOCK_STREAM)
        try:
            probe.bind((address, port))     # free now; nothing will listen on it
            ports.append(port)
        except OSError:
            pass
        finally:
            probe.close()
    return ports


def spread_ports(address, count, low, high, sockets):
    """`count` more listening sockets at ports spread evenly across the range (the first free one
    from each step on): a firewall that opens part of the range shows which part. Appended to
    `sockets`; their ports returned."""
    ports = []
    if count < 2 or high <= low:
        return ports
    step = (high - low) / (count - 1)
    for i in range(count):
        start = low + round(i * step)
        for port in range(start, min(high, start + 16) + 1):
            s = socket.socket(family(address), socket.SOCK_STREAM)
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((address, port))
                s.listen(64)
                s.setblocking(False)
            except OSError:
                s.close()
                continue
            sockets.append(s)
            ports.append(port)
            break
    return ports


def listen(spec):
    address, token = spec["address"], spec["token"].encode()
    sockets, stats = [], {"accepted": {}, "rejected": 0}
    try:
        for port in spec.get("ports") or [0] * spec.get("count", 2):
            s = socket.socket(family(address), socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((address, port))
            s.listen(64)
            s.setblocking(False)
            sockets.append(s)
    except OSError as exc:
        protocol.emit(READY, {"error": f"cannot listen on {address}: {exc.strerror}",
                              "errno": errno.errorcode.get(exc.errno)})
        return
    low, high = spec.get("range") or (32768, 60999)
    spread = spread_ports(address, spec.get("spread", 0), low, high, sockets)
    closed = free_closed_ports(address, spec.get("closed", 1), low, high)
    dropped_before = reverse_path_drops()
    ports = [s.getsockname()[1] for s in sockets]
    protocol.emit(READY, {"ports": ports[:len(ports) - len(spread)], "spread": spread, "closed": closed})
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        serve(sockets, token, stats, stop, time.monotonic() + spec.get("duration", 30))
    finally:
        for s in sockets:
            s.close()
        dropped_after = reverse_path_drops()
        stats["rp_filter_drops"] = None if dropped_before is None or dropped_after is None else \
            dropped_after - dropped_before
        protocol.emit(RESULT, stats)


def serve(sockets, token, stats, stop, until):
    """Every connection at once, each with its own deadline: one that sends nothing (a stranger,
    a scanner) is closed when its time is up and never holds up the others."""
    selector = selectors.DefaultSelector()
    for s in sockets:
        selector.register(s, selectors.EVENT_READ, None)
    pending = {}          # connection -> [deadline, bytes so far, listening port, peer address]
    try:
        while not stop.is_set() and time.monotonic() < until:
            now = time.monotonic()
            wait = min([0.1] + [max(0.0, p[0] - now) for p in pending.values()])
            for key, _ in selector.select(wait):
                if key.data is None:
                    accept(key.fileobj, selector, pending)
                else:
                    receive(key.fileobj, token, selector, pending, stats)
            now = time.monotonic()
            for conn in [c for c, p in pending.items() if p[0] <= now]:
                stats["rejected"] += 1          # said nothing (or not all) in time: not ours
                drop(conn, selector, pending)
    finally:
        for conn in list(pending):
            stats["rejected"] += 1      # still silent when the probe ended: not ours either
            drop(conn, selector, pending)
        selector.close()


def accept(listener, selector, pending):
    while True:
        try:
            conn, peer = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return
        conn.setblocking(False)
        pending[conn] = [time.monotonic() + TOKEN_SECONDS, b"", listener.getsockname()[1], peer[0]]
        selector.register(conn, selectors.EVENT_READ, "conn")


def receive(conn, token, selector, pending, stats):
    state = pending[conn]
    try:
        data = conn.recv(len(token) - len(state[1]))
    except (BlockingIOError, InterruptedError):
        return
    except OSError:
        data = b""
    if not data:
        stats["rejected"] += 1
        drop(conn, selector, pending)
        return
    state[1] += data
    if len(state[1]) < len(token):
        return
    if hmac.compare_digest(state[1], token):
        try:
            conn.send(b"OK")       # two bytes into an empty socket buffer: it does not block
            key = f"{state[3]}>{state[2]}"
            stats["accepted"][key] = stats["accepted"].get(key, 0) + 1
        except OSError:
            stats["rejected"] += 1
    else:
        stats["rejected"] += 1     # not ours: closed and counted
    drop(conn, selector, pending)


def drop(conn, selector, pending):
    pending.pop(conn, None)
    try:
        selector.unregister(conn)
    except (KeyError, ValueError):
        pass
    conn.close()


def try_connect(target, token, timeout):
    outcome = dict(target)
    started = time.monotonic()
    try:
        infos = socket.getaddrinfo(target["address"], target["port"], type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        outcome.update(outcome="unreachable", detail=f"does not resolve: {exc}")
        return outcome
    fam, _, _, _, sockaddr = infos[0]
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:          # queue the ICMP error a refusal may come as (a REJECT rule's), beside errno
        s.setsockopt(*((socket.IPPROTO_IPV6, IPV6_RECVERR) if fam == socket.AF_INET6 else
                       (socket.IPPROTO_IP, IP_RECVERR)), 1)
    except OSError:
        pass
    try:
        s.connect(sockaddr)
        s.sendall(token.encode())
        answer = s.recv(2)
        outcome["outcome"] = "open" if answer == b"OK" else "open-unverified"
    except socket.timeout:
        outcome["outcome"] = "filtered"
    except ConnectionRefusedError:
        outcome["outcome"] = "refused"
        icmp = icmp_error(s)
        if icmp is not None:
            outcome["icmp"] = icmp
    except OSError as exc:
        name = errno.errorcode.get(exc.errno, str(exc.errno))
        if exc.errno in (errno.EHOSTUNREACH, errno.EACCES, errno.EPERM, errno.EHOSTDOWN):
            outcome["outcome"] = "rejected" if exc.errno in (errno.EACCES, errno.EPERM) else "unreachable"
        elif exc.errno in (errno.ENETUNREACH, errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
            outcome["outcome"] = "unreachable"
        else:
            outcome["outcome"] = "error"
        outcome["detail"] = f"{name}: {exc.strerror}"
    finally:
        s.close()
    outcome["resolved"] = sockaddr[0]
    if not _literal(target["address"]):
        outcome["hosts_line"] = hosts_line(target["address"], sockaddr[0])
    outcome["seconds"] = round(time.monotonic() - started, 3)
    return outcome


IP_RECVERR, IPV6_RECVERR = 11, 25      # linux/in.h, linux/in6.h (Python names neither before 3.x)
ICMP_ORIGINS = (2, 3)                  # SO_EE_ORIGIN_ICMP, SO_EE_ORIGIN_ICMP6


def icmp_error(s):
    """The ICMP message that refused a connection ({"type": T, "code": C}), read from the socket's
    error queue; None where the refusal was a TCP reset (nothing queued: no listener, or a REJECT
    rule `with tcp reset`) or the queue cannot be read."""
    try:
        _, ancillary, _, _ = s.recvmsg(0, 512, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)
    except OSError:
        return None
    for level, kind, data in ancillary:
        if (level, kind) in ((socket.IPPROTO_IP, IP_RECVERR), (socket.IPPROTO_IPV6, IPV6_RECVERR)) and len(data) >= 16:
            _, origin, icmp_type, code, _, _, _ = struct.unpack("=IBBBBII", data[:16])
            if origin in ICMP_ORIGINS:
                return {"type": icmp_type, "code": code, "family": 6 if origin == 3 else 4}
    return None


def _literal(address):
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


def hosts_line(name, resolved, path="/etc/hosts"):
    """The line of the hosts file that maps `name` ({"line": N, "text": ...}): the first that
    names it with the address it resolved to, else the first that names it; None where no line
    names it (or the file cannot be read): the name came from elsewhere (DNS)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read(1 << 20).splitlines()
    except OSError:
        return None
    naming = []
    for number, text in enumerate(lines, 1):
        fields = text.split("#", 1)[0].split()
        if len(fields) >= 2 and name.lower() in (f.lower() for f in fields[1:]):
            naming.append((fields[0] != resolved, number, text.strip()[:200]))
    if not naming:
        return None
    _, number, text = min(naming)
    return {"line": number, "text": text}


def connect(spec):
    results = [None] * len(spec["targets"])

    def one(i):
        results[i] = try_connect(spec["targets"][i], spec["token"], spec.get("timeout", 1.5))
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    routes = {}       # one `ip route get` an address, after the dials (their timing is the kernel's alone)
    for outcome in results:
        address = outcome["address"]
        if address not in routes:
            routes[address] = route_to(address)
        outcome["route"] = routes[address]
    protocol.emit(RESULT, results)


def main(spec, work=None):
    {"listen": listen, "connect": connect}[spec["mode"]](spec)
    return 0
