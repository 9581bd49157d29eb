"""Runs ON a node (standard library only, started by the supervisor): listen or connect.

listen:  bind `count` sockets on `address` port 0 (the kernel picks from the ephemeral range,
         as Gloo's listener does) or on fixed `ports`; pick `closed` free ports in the range;
         print READY {...}; accept only connections that present `token` (others are closed
         and counted); on SIGTERM print RESULT {...}.
connect: try every target at once, print RESULT [...]: open (token answered), refused (RST:
         nothing listens, no firewall), rejected (ICMP or a REJECT rule), filtered (silently
         dropped until the timeout: a firewall), unreachable (no route), error."""

import errno
import json
import random
import select
import signal
import socket
import sys
import threading
import time

READY, RESULT = "DDP_PREFLIGHT_READY ", "DDP_PREFLIGHT_RESULT "


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


def listen(spec):
    address, token = spec["address"], spec["token"].encode()
    sockets, stats = [], {"accepted": {}, "rejected": 0}
    try:
        for port in spec.get("ports") or [0] * spec.get("count", 2):
            s = socket.socket(family(address), socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((address, port))
            s.listen(64)
            sockets.append(s)
    except OSError as exc:
        print(READY + json.dumps({"error": f"cannot listen on {address}: {exc.strerror}",
                                  "errno": errno.errorcode.get(exc.errno)}), flush=True)
        return
    low, high = spec.get("range") or (32768, 60999)
    closed = free_closed_ports(address, spec.get("closed", 1), low, high)
    print(READY + json.dumps({"ports": [s.getsockname()[1] for s in sockets], "closed": closed}), flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    deadline = time.monotonic() + spec.get("duration", 30)
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            ready, _, _ = select.select(sockets, [], [], 0.1)
            for s in ready:
                conn, peer = s.accept()
                conn.settimeout(2)
                try:
                    got = conn.recv(len(token))
                    if got == token:
                        conn.sendall(b"OK")
                        key = f"{peer[0]}>{s.getsockname()[1]}"
                        stats["accepted"][key] = stats["accepted"].get(key, 0) + 1
                    else:
                        stats["rejected"] += 1     # not ours: closed and counted
                except OSError:
                    stats["rejected"] += 1
                finally:
                    conn.close()
    finally:
        for s in sockets:
            s.close()
        print(RESULT + json.dumps(stats), flush=True)


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
    try:
        s.connect(sockaddr)
        s.sendall(token.encode())
        answer = s.recv(2)
        outcome["outcome"] = "open" if answer == b"OK" else "open-unverified"
    except socket.timeout:
        outcome["outcome"] = "filtered"
    except ConnectionRefusedError:
        outcome["outcome"] = "refused"
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
    outcome["seconds"] = round(time.monotonic() - started, 3)
    return outcome


def connect(spec):
    results = [None] * len(spec["targets"])

    def one(i):
        results[i] = try_connect(spec["targets"][i], spec["token"], spec.get("timeout", 1.5))
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(RESULT + json.dumps(results), flush=True)


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    {"listen": listen, "connect": connect}[spec["mode"]](spec)
