"""Whether a rank lost a peer or the link, by what the one catalogue (rules/failures.py) says such
a rank says: Gloo's "Connection closed by peer [10.213.5.2]:24077", "Read error ...: Connection
reset by peer", "Timed out waiting 8000ms for recv operation to complete", NCCL's "remote process
exited or there was a network error" and its watchdog's "Watchdog caught collective operation
timeout", the store's lost host. tracebacks.py judges every exception it reads with it, and so
does a rank's own record.

Pure, standard library only. The Gloo, torchrun and store messages were seen in real runs
(tests/unit/artifacts/logs/), NCCL's watchdog on a real H100; NCCL's remote errors are as NCCL's
sources write them."""

from __future__ import annotations

from ddp_preflight.rules.failures import DISTRIBUTED, LOST_PEER_ALWAYS, LOST_PEER_DISTRIBUTED
from ddp_preflight.rules.message_parts import GLOO_PEER, NCCL_PEER

# The words are the one catalogue's (rules/failures.py): said only by a rank that lost a peer or
# waited for one past the timeout (LOST_PEER_ALWAYS), or by any socket, and then a peer's only in a
# message of torch.distributed, Gloo or NCCL (DISTRIBUTED and LOST_PEER_DISTRIBUTED).


def lost_peer(type: str, message: str) -> bool:
    """The message is one a rank gives when it loses a peer or the link (Gloo, NCCL, the store)."""
    text = f"{type}: {message}"
    if any(phrase in text for phrase in LOST_PEER_ALWAYS):
        return True
    return bool(DISTRIBUTED.search(text) and LOST_PEER_DISTRIBUTED.search(text))


def peer_in(message: str) -> str | None:
    """The peer's address a lost-peer message names: "10.213.5.2:24077", "[fd64::11]:24077"."""
    found = GLOO_PEER.search(message) or NCCL_PEER.search(message)
    if found is None or found["host"] == "none":
        return None
    host = found["host"]
    return f"[{host}]:{found['port']}" if ":" in host else f"{host}:{found['port']}"
