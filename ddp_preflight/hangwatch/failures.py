"""What a failure's own words say of its cause: the messages that name a cause (an address family,
a busy port, a collective the backend lacks, an NCCL or CUDA error), as the one catalogue
(rules/failures.py) words them and its patterns read them (none is matched here), beside
lost_peer.py's catalogue of the messages of a rank that lost a peer (tracebacks.py reads how a
rank ended). Read on the master by `ddp-preflight explain` on a run's logs; the causes and fixes
of each are in causes.py.

Pure, standard library only. Every message was seen in a real run (tests/unit/artifacts/logs/ and
tests/unit/artifacts/explain/: Gloo, torchrun, the store; shared artifacts from an H100: NCCL's
watchdog and its invalid usage), except those marked "source": NCCL's system error and CUDA's out
of memory, taken from NCCL's and torch's sources (no GPU at hand to make them)."""

from __future__ import annotations

from dataclasses import dataclass

from ddp_preflight.rules.failure_kinds import Cause, FailureKind
from ddp_preflight.rules.failures import (
    BACKEND_NAMED,
    BY_ID,
    CLIENT_TIMEOUT,
    CONNECT,
    CUDA_OOM_TYPE,
    GLOO_TIMEOUT,
    IN_USE,
    NCCL,
    NOT_IMPLEMENTED,
    OOM_KILL,
    RENDEZVOUS,
    USAGE_ERROR,
    WAITING_CLIENTS,
    WATCHDOG,
)
from ddp_preflight.rules.message_parts import OPTION, PG_STATUS, PORT, RANK_IN_LOG

# What a failure's words name is said in the one vocabulary of failures (rules/failure_kinds.py): its
# kind, and where one kind has several causes its words tell apart (NCCL's), the cause.
Failure = FailureKind
K = FailureKind


@dataclass(frozen=True)
class Said:
    """A failure as its message says it, with what the message names."""
    failure: FailureKind
    detail: dict                               # e.g. {"own": 10, "peer": 2}, {"port": 29500}, {"call": "Work::getFuture"}
    cause: Cause | None = None                 # NCCL's: a duplicate GPU, invalid usage, a system error (else UNKNOWN)


# Every message is read by a pattern of the one catalogue (rules/failures.py: its messages, and those
# read in their own form), every field by one of rules/message_parts.py.
FAMILY = BY_ID["address-family"].pattern
DUPLICATE_GPU = BY_ID["duplicate-gpu"].pattern
EPHEMERAL = BY_ID["gloo-pair-bind"].pattern
CUDA_OOM = BY_ID["cuda-oom"].pattern
NCCL_INVALID_USAGE = BY_ID["nccl-invalid-usage"].pattern      # "invalid usage|ncclInvalidUsage"
NCCL_SYSTEM_ERROR = BY_ID["nccl-system-error"].pattern        # "unhandled system error|ncclSystemError"
SIZE_MISMATCH = BY_ID["gloo-size-mismatch"].pattern


def said_by(type: str, message: str) -> Said | None:
    """The failure an exception (its type and message) names the cause of; None: its words name none
    (its own bug, a lost peer: tracebacks.py says which)."""
    text = f"{type}: {message}"
    found = FAMILY.search(text)
    if found:
        return Said(K.ADDRESS_FAMILY, {"own": int(found["own"]), "peer": int(found["peer"])})
    found = SIZE_MISMATCH.search(text)
    if found:
        return Said(K.MISMATCH, {"got": int(found["got"]) if found["got"] else None,
                                            "expected": int(found["expected"]) if found["expected"] else None})
    found = CONNECT.search(text)
    if found:
        return Said(K.CANNOT_CONNECT, {"why": found["why"], "peer": _peer(found["peer"], found["port"])})
    if IN_USE.search(text) and not EPHEMERAL.search(text):     # Gloo's own pair socket: not the master port
        port = PORT.search(text)
        return Said(K.PORT_IN_USE, {"port": int(port["port"]) if port else None})
    found = WAITING_CLIENTS.search(text)
    if found:
        return Said(K.STORE_TIMEOUT, {"seconds": int(found["seconds"]), "joined": int(found["joined"]),
                                                 "world": int(found["world"]), "side": "store"})
    found = CLIENT_TIMEOUT.search(text)
    if found:
        return Said(K.STORE_TIMEOUT, {"store": f"{found['host']}:{found['port']}", "side": "client",
                                                 "said": found.group(0)})
    if RENDEZVOUS.search(text):
        return Said(K.STORE_TIMEOUT, {})
    found = DUPLICATE_GPU.search(text)
    if found:
        return Said(K.NCCL_ERROR, {"ranks": [int(found["a"]), int(found["b"])], "device": found["device"]},
                    Cause.DUPLICATE_GPU)
    if NCCL.search(text):
        if NCCL_INVALID_USAGE.search(text):
            return Said(K.NCCL_ERROR, {}, Cause.NCCL_INVALID_USAGE)
        if NCCL_SYSTEM_ERROR.search(text):
            return Said(K.NCCL_ERROR, {}, Cause.NCCL_SYSTEM_ERROR)
        return Said(K.NCCL_ERROR, {}, Cause.UNKNOWN)
    found = CUDA_OOM.search(text)
    if found or type.endswith(CUDA_OOM_TYPE):
        return Said(K.OOM_CUDA, {"size": found["size"] if found else None})
    found = NOT_IMPLEMENTED.search(text)
    if found and BACKEND_NAMED.search(text):
        return Said(K.UNSUPPORTED, {"call": found["call"] or found["what"] or found["op"]})
    found = GLOO_TIMEOUT.search(text)
    if found:
        return Said(K.TIMEOUT_UNKNOWN_ROOT, {"ms": int(found["ms"]), "op": found["op"]})
    return None


def usage_error(text: str) -> Said | None:
    """torchrun's own parser refusing the command line ("run.py: error: ambiguous option: --run=x
    could match --run-path, --run_path"): the script's options read as torchrun's."""
    found = USAGE_ERROR.match(text)
    if found is None:
        return None
    option = OPTION.search(found["what"])
    return Said(K.SCRIPT_OPTIONS, {"what": found["what"], "option": option["option"] if option else None})


def oom_kill(text: str) -> Said | None:
    """The kernel's OOM killer as dmesg says it, or Slurm's step that counted its kills."""
    found = OOM_KILL.search(text)
    if found is None:
        return None
    return Said(K.OOM_HOST, {"pid": int(found["pid"]) if found["pid"] else None, "name": found["name"]})


@dataclass(frozen=True)
class WatchdogLine:
    """NCCL's watchdog on one rank: the collective that timed out, or where its group was."""
    rank: int | None
    seq: int | None = None           # WorkNCCL(SeqNum=...)
    op: str | None = None            # "all_reduce"
    timeout_ms: int | None = None
    enqueued: int | None = None      # "last enqueued work: 66"
    completed: int | None = None     # "last completed work: 64"


def watchdog(text: str) -> WatchdogLine | None:
    """A watchdog line ("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=65,
    OpType=ALLREDUCE, ...) ran for 60022 milliseconds", "failure detected by watchdog ... last
    enqueued work: 66, last completed work: 64"), as recorded on an H100."""
    caught, status = WATCHDOG.search(text), PG_STATUS.search(text)
    if caught is None and status is None:
        return None
    who = RANK_IN_LOG.search(text)
    rank = int(who["rank"] or who["pgrank"]) if who else None
    if caught:
        return WatchdogLine(rank, int(caught["seq"]), op_name(caught["op"]),
                            int(caught["timeout"]) if caught["timeout"] else None)
    assert status is not None
    return WatchdogLine(rank, enqueued=int(status["enqueued"]), completed=int(status["completed"]))


def op_name(op: str) -> str:
    """NCCL's OpType ("ALLREDUCE", "_ALLGATHER_BASE") as the call's name ("all_reduce")."""
    names = {"ALLREDUCE": "all_reduce", "ALLGATHER": "all_gather", "REDUCE_SCATTER": "reduce_scatter",
             "BROADCAST": "broadcast", "BARRIER": "barrier", "ALLTOALL": "all_to_all", "REDUCE": "reduce",
             "SEND": "send", "RECV": "recv", "GATHER": "gather", "SCATTER": "scatter",
             "_ALLGATHER_BASE": "all_gather_into_tensor", "_REDUCE_SCATTER_BASE": "reduce_scatter_tensor",
             "ALLTOALL_BASE": "all_to_all_single"}
    return names.get(op.upper(), op.lower())


def family_name(number: int) -> str:
    return {2: "IPv4", 10: "IPv6"}.get(number, f"family {number}")


def _peer(host: str | None, port: str | None) -> str | None:
    if not host or host == "none":
        return None
    return f"{host}:{port}" if port else host
