"""The failure messages read in their own form, outside the catalogue (rules/failures.py's find()
tries only the catalogue's): the shapes of Gloo's connectFullMesh, the store's and rendezvous's
timeouts, NCCL's watchdog, the kernel's OOM killer, a lost peer's words, and the words of a failed
probe job. Pure, standard library only; rules/failures.py names them among every word a failure
message is told by (WORDS)."""

from __future__ import annotations

import re

# -- Messages read in their own form, outside CATALOGUE (find() tries only the messages above) ------
# hangwatch (failures.py, lost_peer.py, tracebacks.py), explain's reading of logs and preflight's
# checks take them from here, so every wording of torch, NCCL, Gloo, the launchers and the kernel
# is in this module (the fields read out of them, and the words searched for first: message_parts.py). WORDS: what each is told by
# (tests/unit/test_layers.py: no module outside rules/ matches one of them itself).
# Gloo's connectFullMesh: a pair never connected (a timeout, refused, no route).
CONNECT = re.compile(r"connectFullMesh failed with .*?(?P<why>Connect timeout|Connection refused|No route to host"
                     r"|Network is unreachable)(?:,? (?:remote=)?\[(?P<peer>[^\]]*)\](?::(?P<port>\d+))?)?")
IN_USE = re.compile(r"EADDRINUSE|[Aa]ddress already in use")       # any torch's store (or Gloo's pair: gloo-pair-bind)
# The store, on the master: ranks that never came; on a rank: a store it never reached; elastic's rendezvous.
WAITING_CLIENTS = re.compile(r"Timed out after (?P<seconds>\d+) seconds waiting for clients\. (?P<joined>\d+)/(?P<world>\d+)")
CLIENT_TIMEOUT = re.compile(r"client socket has timed out after (?P<seconds>[\d.]+)(?:ms|s)? while trying to connect to "
                            r"\((?P<host>[^,]+), (?P<port>\d+)\)")
RENDEZVOUS = re.compile(r"RendezvousTimeoutError|rendezvous .*timed out", re.IGNORECASE)
# A call the backend lacks; BACKEND_NAMED: the message is the backend's (not the user's own code's).
NOT_IMPLEMENTED = re.compile(r"(?P<call>[\w:]+) not implemented|does not support (?P<what>[\w ]+?)(?:\.|,|$)"
                             r"|(?P<op>\w+) is not supported (?:by|on|with) (?:the )?(?P<backend>\w+)")
BACKEND_NAMED = re.compile(r"Gloo|gloo|Work::|ProcessGroup|NCCL")
# torchrun's argparse refusing the command line ("run.py: error: ambiguous option: --run=x ...").
USAGE_ERROR = re.compile(r"^(?P<prog>torchrun|run\.py|[\w./-]*run\.py): error: (?P<what>.+)$")
NCCL = re.compile(r"NCCL error|nccl\w*Error|ncclInvalidUsage|ncclSystemError|ncclInternalError|ncclUnhandledCudaError")
CUDA_OOM_TYPE = "OutOfMemoryError"       # torch.OutOfMemoryError, whatever its message says
GLOO_TIMEOUT = re.compile(r"Timed out waiting (?P<ms>\d+) ?ms for (?P<op>recv|send) operation")
# NCCL's watchdog: the collective that ran past its timeout; the line a rank's traceback reader starts at.
WATCHDOG = re.compile(r"WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)[^)]*?(?:Timeout\(ms\)=(?P<timeout>\d+))?\) "
                      r"ran for (?P<ran>\d+) milliseconds")
WATCHDOG_CAUGHT = re.compile(r"(?:\[Rank \d+\] )?Watchdog caught collective operation timeout: .*")
WATCHDOG_CAUGHT_WORD = "Watchdog caught"
# The kernel's OOM killer as dmesg says it, or Slurm's step that counted its kills.
OOM_KILL = re.compile(r"Out of memory: Killed process (?P<pid>\d+) \((?P<name>[^)]*)\)"
                      r"|Detected (?P<events>\d+) oom[-_]kill event")
# A rank that lost a peer or the link: said only so (ALWAYS), or by any socket, and then a peer's only
# in a message of torch.distributed, Gloo or NCCL (a user's own HTTP error says "Connection reset by peer").
LOST_PEER_ALWAYS = (
    "Connection closed by peer",                              # Gloo: the peer's socket closed (exit, crash, kill)
    "Watchdog caught collective operation timeout",           # NCCL's watchdog
    "remote process exited or there was a network error",     # NCCL's ncclRemoteError
    "ncclRemoteError",
    "Connection closed by remote peer",                       # NCCL's socket transport
    "operations have failed or timed out",                    # torch after an NCCL timeout
    "failed to pass monitoredBarrier",                        # a peer never reached the barrier
)
DISTRIBUTED = re.compile(r"gloo|nccl|c10d|ProcessGroup|TCPStore|Dist(?:Backend|Network|Store)Error", re.IGNORECASE)
LOST_PEER_DISTRIBUTED = re.compile(
    r"Connection reset by peer|Broken pipe|\bRead error\b|\bWrite error\b|"
    r"Timed out waiting \d+ ?ms for (?:recv|send) operation"       # Gloo's timeout
    r"|Connection refused|No route to host|Network is unreachable|Connect timeout"   # the link (connectFullMesh, the store)
    r"|Failed to recv, got 0 bytes|Failed to send, sent 0 bytes"   # the store's host went away
    r"|Timed out after \d+ seconds waiting for (?:clients|workers)|wait timeout after \d+ ?ms")   # peers that never came
# A failed job's error, as preflight's probes report it: a CUDA or NCCL error ("CUDA error: invalid
# device ordinal", "Torch not compiled with CUDA enabled", a CPU build's missing _cuda_setDevice), or
# a store or rendezvous that failed (STORE_WORDS: also the words of a store's timeout).
GPU_WORDS = ("CUDA", "cuda", "NCCL", "Duplicate GPU", "device ordinal", "NVML")
RENDEZVOUS_WORDS = ("DistNetworkError", "DistStoreError", "endezvous")
STORE_WORDS = RENDEZVOUS_WORDS + ("timed out",)
