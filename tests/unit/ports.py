"""A port for a test's own torchrun store or server."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def free_port() -> int:
    """Free now, and below the ephemeral range, so that no outgoing connection of another test
    (make test runs two workers) is given it before the test binds it (seen once: torchrun's
    store could not bind, and the ranks never started)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in random.sample(range(20000, min(low, 32768)), 200):
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port below the ephemeral range")
