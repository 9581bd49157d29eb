"""Can this port be bound here now? Exit 0 if so (the launcher's check that a run's master port
was freed). spec: {"address": "" for every interface, or an address, "port": n}"""

from __future__ import annotations

import socket


def main(spec: dict, work=None) -> int:
    address = spec.get("address") or ""
    s = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((address, int(spec["port"])))
    except OSError:
        return 1
    finally:
        s.close()
    return 0
