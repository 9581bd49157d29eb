"""The vocabulary of failures (rules/failures.py holds the catalogue of messages in it): what kind of
failure a message is, its cause, how sure its words make it, and its part in a run's failure.
Pure, standard library only."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from .fix import Fix


class FailureKind(str, enum.Enum):
    """What kind of failure a run had, as its logs show it (a closed set)."""
    EXITED = "exited"                                  # a rank ended with an error of its own, or nothing says why
    SIGNAL_KILLED = "signal-killed"                    # SIGKILL, with no exception of its own
    CRASHED = "crashed-segv-abort"                     # SIGSEGV / SIGABRT
    OOM_CUDA = "oom-cuda"
    OOM_HOST = "oom-host"
    MISMATCH = "collective-mismatch"                   # ranks issued different collectives
    RANK_BEHIND = "rank-behind"                        # a rank behind the others in one process group
    TIMEOUT_UNKNOWN_ROOT = "timeout-unknown-root"      # a collective timed out; the logs do not say who is late
    STORE_TIMEOUT = "store-timeout"                    # the store or the rendezvous timed out
    PORT_IN_USE = "port-in-use"
    GLOO_ADDRESS = "gloo-address"                      # Gloo found no usable address for its host
    ADDRESS_FAMILY = "address-family"                  # IPv4 and IPv6 ends of one pair
    UNSUPPORTED = "unsupported-collective"
    NCCL_ERROR = "nccl-error"
    UNUSED_PARAMETERS = "ddp-unused-parameters"
    NODE_NOT_STARTED = "node-not-started"              # a launch could not start its training on a node
    CANNOT_CONNECT = "cannot-connect"                  # a rank could not open a connection to a peer it had the address of
    SCRIPT_OPTIONS = "script-options"                  # torchrun's parser took the script's options for its own
    # Older names of two members, from when hangwatch's reading of a failure's words had a vocabulary
    # of its own (hangwatch/failures.py's Failure is this enum now): the same members, not more kinds.
    OOM_KILLED = "oom-host"
    RENDEZVOUS_TIMEOUT = "store-timeout"


class Cause(str, enum.Enum):
    """Why, as far as the messages show it (a closed set); UNKNOWN*: they do not show it."""
    UNKNOWN = "unknown"
    COLLECT_FLIGHT_RECORDER = "unknown-collect-flight-recorder"   # every rank waits: the dumps say who is late
    SIGKILL = "sigkill-oom-or-scheduler"
    SEGFAULT = "segfault"
    ABORT = "abort"
    PYTHON_EXCEPTION = "python-exception"
    CUDA_OOM = "cuda-oom"
    HOST_OOM = "host-oom"
    MASTER_PORT = "master-port-in-use"
    EPHEMERAL_PORTS = "ephemeral-ports-exhausted"
    DIFFERENT_COLLECTIVES = "different-collectives"
    BEHIND = "rank-behind-same-group"
    STORE_UNREACHABLE = "store-unreachable"
    NEVER_JOINED = "ranks-never-joined"
    EXTRA_PROCESSES = "extra-processes-joined"
    GLOO_HOSTNAME = "gloo-hostname-unresolvable"
    GLOO_LOOPBACK = "gloo-loopback-fallback"
    IPV4_IPV6 = "ipv4-ipv6-mix"
    GLOO_UNSUPPORTED = "gloo-unsupported-op"
    DUPLICATE_GPU = "nccl-duplicate-gpu"
    NCCL_INVALID_USAGE = "nccl-invalid-usage"
    NCCL_SYSTEM_ERROR = "nccl-system-error"
    NCCL_REMOTE = "nccl-remote-peer-gone"
    UNUSED_PARAMETERS = "unused-parameters"
    NODE_ERROR = "node-error"                          # the launch's own record of the node's error
    NCCL_FAMILY = "nccl-address-family-unsupported"    # NCCL picked an address of a family the host has no sockets for
    IB_COMPLETION = "nccl-ib-completion-error"         # an InfiniBand/RoCE transfer failed on the link or its peer
    PEER_UNREACHABLE = "peer-unreachable"              # a peer's listening port did not answer (firewall, interface)
    SHARED_MEMORY = "shared-memory-too-small"          # a DataLoader worker's bus error: /dev/shm too small
    LOCAL_RANK_OPTION = "local-rank-option"            # the launcher passes --local-rank, the script parses --local_rank
    NCCL_NOT_BUILT = "nccl-not-built"                  # this torch has no NCCL (Windows, macOS, a CPU build)
    NO_CUDA = "no-cuda"                                # the code used CUDA where torch sees none (a CPU build, no GPU)
    BUS_ERROR = "bus-error"                            # SIGBUS: memory behind a mapping could not be backed (/dev/shm)
    LIBUV_NOT_BUILT = "libuv-not-built"                # torchrun's store asked for libuv on a build without it (Windows)
    GLOO_INTERFACE = "gloo-interface-missing"          # GLOO_SOCKET_IFNAME names an interface with no address here
    NCCL_CUDA = "nccl-cuda-failure"                    # a CUDA call of NCCL's failed (a driver older than its CUDA)


class Sure(str, enum.Enum):
    """How sure a finding is of its whole verdict (the culprits and the cause)."""
    CERTAIN = "certain"      # the deciding line is in the log
    LIKELY = "likely"        # inferred (a local rank taken as the rank, a SIGKILL's sender, a victim's word)
    UNKNOWN = "unknown"      # the log cannot tell who: say what to collect


class Part(str, enum.Enum):
    """What a message is to the run's failure."""
    ROOT = "root"            # names a cause by itself
    TIMEOUT = "timeout"      # a collective or the watchdog timed out: the root is whom it waited for
    VICTIM = "victim"        # a rank that lost its peer or was stopped: never the root
    EXIT = "exit"            # a launcher's word on how a rank ended (torchrun's line and table, DeepSpeed's)


@dataclass(frozen=True)
class Message:
    """One failure message: the words it is told by, what it is and means, and its fix."""
    id: str
    words: tuple[str, ...]           # one of these is in the line (a byte search, before the pattern)
    pattern: re.Pattern[str]
    kind: FailureKind
    cause: Cause
    part: Part
    meaning: str
    fix: Fix | None = None
    sure: Sure = Sure.CERTAIN        # how sure its words alone make the verdict


def _m(id: str, words: tuple[str, ...], pattern: str, kind: FailureKind, cause: Cause, part: Part, meaning: str,
       fix: Fix | None = None, sure: Sure = Sure.CERTAIN) -> Message:
    return Message(id, words, re.compile(pattern), kind, cause, part, meaning, fix, sure)
