"""The catalogue of what a rank says when it loses a peer or the link: Gloo's "Connection closed by
peer [10.213.5.2]:24077", "Read error ...: Connection reset by peer", "Timed out waiting 8000ms for
recv operation to complete", NCCL's "remote process exited or there was a network error" and its
watchdog's "Watchdog caught collective operation timeout", the store's lost host. One catalogue:
tracebacks.py judges every exception it reads with it, and so does a rank's own record.

Pure, standard library only. The Gloo, torchrun and store messages were seen in real runs
(tests/unit/artifacts/logs/), NCCL's watchdog on a real H100; NCCL's remote errors are as NCCL's
sources write them."""

from __future__ import annotations

import re

# Said only by a rank that lost a peer or waited for one past the timeout.
LOST_PEER_ALWAYS = (
    "Connection closed by peer",                              # Gloo: the peer's socket closed (exit, crash, kill)
    "Watchdog caught collective operation timeout",           # NCCL's watchdog
    "remote process exited or there was a network error",     # NCCL's ncclRemoteError
    "ncclRemoteError",
    "Connection closed by remote peer",                       # NCCL's socket transport
    "operations have failed or timed out",                    # torch after an NCCL timeout
    "failed to pass monitoredBarrier",                        # a peer never reached the barrier
)
# Said by any socket: a peer or the link only in a message of torch.distributed, Gloo or NCCL (a
# user's own HTTP error says "Connection reset by peer" too).
DISTRIBUTED = re.compile(r"gloo|nccl|c10d|ProcessGroup|TCPStore|Dist(?:Backend|Network|Store)Error", re.IGNORECASE)
LOST_PEER_DISTRIBUTED = re.compile(
    r"Connection reset by peer|Broken pipe|\bRead error\b|\bWrite error\b|"
    r"Timed out waiting \d+ ?ms for (?:recv|send) operation"       # Gloo's timeout
    r"|Connection refused|No route to host|Network is unreachable|Connect timeout"   # the link (connectFullMesh, the store)
    r"|Failed to recv, got 0 bytes|Failed to send, sent 0 bytes"   # the store's host went away
    r"|Timed out after \d+ seconds waiting for clients|wait timeout after \d+ ?ms")   # peers that never came


def lost_peer(type: str, message: str) -> bool:
    """The message is one a rank gives when it loses a peer or the link (Gloo, NCCL, the store)."""
    text = f"{type}: {message}"
    if any(phrase in text for phrase in LOST_PEER_ALWAYS):
        return True
    return bool(DISTRIBUTED.search(text) and LOST_PEER_DISTRIBUTED.search(text))


GLOO_PEER = re.compile(r"\[(?P<host>[0-9A-Za-z.:%_-]+)\]:(?P<port>\d+)")      # Gloo: "[10.213.5.2]:24077"
NCCL_PEER = re.compile(r"(?P<host>[0-9A-Za-z.:%_-]+)<(?P<port>\d+)>")          # NCCL: "10.213.5.2<24077>"


def peer_in(message: str) -> str | None:
    """The peer's address a lost-peer message names: "10.213.5.2:24077", "[fd64::11]:24077"."""
    found = GLOO_PEER.search(message) or NCCL_PEER.search(message)
    if found is None or found["host"] == "none":
        return None
    host = found["host"]
    return f"[{host}]:{found['port']}" if ":" in host else f"{host}:{found['port']}"
