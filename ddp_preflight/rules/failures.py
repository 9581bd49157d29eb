"""The one catalogue of the failure messages torch, NCCL, Gloo and the launchers print, as data:
for each message, the words it is told by (every wording torch 1.13 .. 2.13 prints, read from
c10d's socket.cpp, TCPStore.cpp, ProcessGroupNCCL.cpp, ProcessGroupGloo.cpp, gloo's
transport/tcp/{pair,device}.cc, distributed_c10d.py, elastic's api.py, errors/ and
rendezvous/, DDP's reducer.cpp, NCCL's init.cc), what kind of failure it is, what it means and
its fix (ddp_preflight.rules.fix.Fix). `ddp-preflight explain`, hangwatch's reading of a rank's output and
preflight's causes read it; every message is in a log users pasted into a public issue
(tests/unit/artifacts/pasted/, index.json says where from) or recorded on the lab.

Pure, standard library only: a message is matched anywhere in a line (pastes run lines
together), after a cheap search for one of its words."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .failure_kinds import Cause, FailureKind, Message, Part, Sure, _m
from .failure_lines import (  # noqa: F401  (also read as rules.failures.X)
    BACKEND_NAMED,
    CLIENT_TIMEOUT,
    CONNECT,
    CUDA_OOM_TYPE,
    DISTRIBUTED,
    GLOO_TIMEOUT,
    GPU_WORDS,
    IN_USE,
    LOST_PEER_ALWAYS,
    LOST_PEER_DISTRIBUTED,
    NCCL,
    NOT_IMPLEMENTED,
    OOM_KILL,
    RENDEZVOUS,
    RENDEZVOUS_WORDS,
    STORE_WORDS,
    USAGE_ERROR,
    WAITING_CLIENTS,
    WATCHDOG,
    WATCHDOG_CAUGHT,
    WATCHDOG_CAUGHT_WORD,
)
from .failures_flight import ANALYZER
from .failures_nccl import NCCL_WORDS
from .failures_partial import PARTIAL
from .failures_setup import SETUP
from .failures_stopped import STOPPED
from .fix import change, run
from .message_parts import DEEPSPEED_EXIT_WORD

K, C, P = FailureKind, Cause, Part
_NCCL_DEVICE = change("give each rank its own GPU: torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before "
                      "init_process_group, and no more ranks per node than GPUs (--nproc-per-node)")
_WORKER_CRASHED = change("DataLoader(num_workers=0) once: the crash then happens in the rank itself, with its stack")
_FLIGHT = run("export TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1   # then "
              "ddp-preflight explain the dumps (TORCH_NCCL_DEBUG_INFO_TEMP_FILE)",
              note="each rank's Flight Recorder says which rank never entered the collective")

# In the order a line is tried: the narrower wording before the wider one that also matches it (SETUP's
# before all: Gloo's interface lookup before its hostname lookup).
CATALOGUE: tuple[Message, ...] = SETUP + (
    # ports: Gloo's own pair sockets (an ephemeral port) before the store's master port
    _m("gloo-pair-bind", ("Address already in use",), r"pair\.cc:\d+\]\s*(?:bind|listen): Address already in use",
       K.PORT_IN_USE, C.EPHEMERAL_PORTS, P.ROOT,
       "Gloo could not bind a pair socket: the node ran out of ephemeral ports (too many processes or "
       "connections), not the master port",
       run("sysctl net.ipv4.ip_local_port_range; ss -s", note="widen the range or run fewer processes per node"),
       Sure.LIKELY),
    _m("store-port-in-use", ("Address already in use", "EADDRINUSE"),
       r"(?:server socket has failed to (?:bind to|listen on) \S*?:(?P<port>\d+)[^\n]*?(?:errno: 98|EADDRINUSE|"
       r"Address already in use)|EADDRINUSE|errno: 98 - Address already in use|\[Errno 98\] Address already in use"
       r"|Error: Address already in use)",      # torch 1.x's TCPStore: "RuntimeError: Address already in use"
       K.PORT_IN_USE, C.MASTER_PORT, P.ROOT,
       "the store could not listen: another process (an earlier run, a second job) holds the master port",
       run("ss -ltnp 'sport = :MASTER_PORT'", note="stop that process, or give this run another --master-port")),
    _m("gloo-hostname", ("Unable to find address for",), r"Unable to find address for:? ?(?P<host>\S+)",
       K.GLOO_ADDRESS, C.GLOO_HOSTNAME, P.ROOT,
       "Gloo could not resolve this node's hostname to an address",
       change("export GLOO_SOCKET_IFNAME=<the LAN interface> on every node (or make the hostname resolve in /etc/hosts)")),
    _m("gloo-loopback", ("loopback address as fallback",), r"Using the loopback address as fallback",
       K.GLOO_ADDRESS, C.GLOO_LOOPBACK, P.ROOT,
       "Gloo bound the loopback address: its peers on other nodes cannot reach it",
       change("export GLOO_SOCKET_IFNAME=<the LAN interface> on every node"), Sure.LIKELY),
    _m("address-family", ("ss_family",), r"ss1\.ss_family == ss2\.ss_family\. (?P<own>\d+) vs (?P<peer>\d+)",
       K.ADDRESS_FAMILY, C.IPV4_IPV6, P.ROOT,
       "the two ends of a Gloo pair bound different address families (IPv4 and IPv6)",
       change("export GLOO_SOCKET_IFNAME=<the LAN interface> on every node, one address family for all")),
    _m("gloo-family-mismatch", ("address family mismatch",), r"pair\.cc:\d+\] address family mismatch",
       K.ADDRESS_FAMILY, C.IPV4_IPV6, P.ROOT,
       "the two ends of a Gloo pair bound different address families (IPv4 and IPv6): older Gloo's wording",
       change("export GLOO_SOCKET_IFNAME=<the LAN interface> on every node, one address family for all")),
    _m("nccl-socket-family", ("Socket creation failed",), r"Socket creation failed : Address family not supported",
       K.ADDRESS_FAMILY, C.NCCL_FAMILY, P.ROOT,
       "NCCL opened a socket of an address family this host has none of (an IPv6 address where IPv6 is off)",
       change("export NCCL_SOCKET_IFNAME=<the LAN interface> NCCL_SOCKET_FAMILY=AF_INET on every node")),
    # a connection to a peer whose address the rank had (Gloo's pairs, NCCL's bootstrap and sockets)
    _m("gloo-connect", ("connectFullMesh", "Connect timeout", "Connection refused", "No route to host"),
       r"connectFullMesh failed with \[[^\]]*\]|pair\.cc:\d+\] (?:connect \[(?P<peer>[^\]]*)\]:(?P<port>\d+): )?"
       r"(?:Connect timeout|Connection refused|No route to host)", K.CANNOT_CONNECT, C.PEER_UNREACHABLE, P.ROOT,
       "a Gloo pair could not connect to its peer's listening port: a firewall drops the ephemeral ports, a node "
       "advertised an address on an interface the others cannot reach, or the peer never listened",
       run("ddp-preflight MASTER WORKER ... --only ephemeral-ports,interface-choice",
           note="which node's ports the others cannot reach, and the GLOO_SOCKET_IFNAME to pin"), Sure.LIKELY),
    _m("nccl-connect", ("Call to connect", "Connect to "), r"(?:NCCL )?WARN (?:Call to connect|Connect to \S+)[^\n]*?"
       r"(?:Connection timed out|Connection refused|No route to host)",
       K.CANNOT_CONNECT, C.PEER_UNREACHABLE, P.ROOT,
       "NCCL could not connect to a peer's socket: a firewall between the nodes, or an interface they cannot reach",
       change("export NCCL_SOCKET_IFNAME=<the LAN interface> on every node, and open TCP between the nodes"),
       Sure.LIKELY),
    _m("duplicate-gpu", ("Duplicate GPU",), r"Duplicate GPU detected ?: rank (?P<a>\d+) and rank (?P<b>\d+)"
       r"(?: both on CUDA device (?P<device>\w+))?",
       K.NCCL_ERROR, C.DUPLICATE_GPU, P.ROOT, "two ranks use one GPU", _NCCL_DEVICE),
    _m("nccl-not-built", ("have NCCL built in",), r"Distributed package doesn't have NCCL built in",
       K.NCCL_ERROR, C.NCCL_NOT_BUILT, P.ROOT,
       "this torch has no NCCL: NCCL is Linux-only, and a CPU build of torch has none",
       change("init_process_group(backend='gloo') here, or a CUDA build of torch on Linux for NCCL")),
    _m("no-cuda", ("'_cuda_", "compiled with CUDA", "No CUDA GPUs", "no CUDA-capable", "no NVIDIA driver", "without CUDA"),
       r"module 'torch\._C' has no attribute '_cuda_\w+'|Torch not compiled with CUDA enabled|No CUDA GPUs are available"
       r"|no CUDA-capable device is detected|Found no NVIDIA driver on your system|PyTorch was compiled without CUDA support",
       K.EXITED, C.NO_CUDA, P.ROOT, "the training code used CUDA (a device pinned or a tensor moved to it) where this "
       "node's torch sees no GPU", change("on a CPU run, put the CUDA calls at the line shown (torch.cuda.set_device, "
       ".cuda(), device='cuda') under `if torch.cuda.is_available():`, so each rank keeps the CPU device it was given; on "
       "a GPU run, a CUDA build of torch on a node whose GPU and driver it sees (nvidia-smi)")),
    _m("nccl-invalid-usage", ("invalid usage", "ncclInvalidUsage"), r"invalid usage|ncclInvalidUsage",
       K.NCCL_ERROR, C.NCCL_INVALID_USAGE, P.ROOT,
       "NCCL refused a call (two ranks on one GPU, mixed streams, too many async ops): NCCL_DEBUG=WARN says which",
       run("export NCCL_DEBUG=WARN", note="and rerun: NCCL prints which usage it refused")),
    _m("nccl-system-error", ("unhandled system error", "ncclSystemError"), r"unhandled system error|ncclSystemError",
       K.NCCL_ERROR, C.NCCL_SYSTEM_ERROR, P.ROOT,
       "a system call NCCL made failed (a socket, shared memory, an interface): NCCL_DEBUG=INFO says which",
       run("export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET", note="and rerun: NCCL names the call and interface")),
    _m("nccl-remote", ("remote process exited", "ncclRemoteError", "NCCL WARN", "Net : "), r"remote process exited or "
       r"there was a network error|ncclRemoteError|(?:NCCL WARN |^Net : )[^\n]*?(?:Broken pipe|Connection reset by peer|"
       r"Connection closed by remote peer)", K.NCCL_ERROR, C.NCCL_REMOTE, P.ROOT,
       "a peer's process exited or the network failed under NCCL: the first rank to fail is in another log",
       run("grep -n 'Traceback\\|exitcode\\|Signal' <every node's log>", note="the peer that ended first"),
       Sure.LIKELY),
    _m("nccl-ib-completion", ("Got completion",), r"NET/IB\w* ?: ?Got completion (?:from peer (?P<peer>\S+) )?with "
       r"(?:error |status=)(?P<code>\d+)", K.NCCL_ERROR, C.IB_COMPLETION, P.ROOT,
       "an InfiniBand/RoCE transfer failed (error 12: the link gave up retrying; 5: flushed after an earlier error): "
       "a port down or flapping, or the peer's process died",
       run("ibstat; ibv_devinfo | grep -i state", note="on both nodes; a peer that died first says so in its own log"),
       Sure.LIKELY),
    _m("nccl-error", ("NCCL error", "ncclInternalError"), r"NCCL error in: \S+, (?P<what>[^,\n]+)|ncclInternalError: "
       r"Internal check failed", K.NCCL_ERROR, C.UNKNOWN, P.ROOT,
       "NCCL returned an error", run("export NCCL_DEBUG=INFO", note="and rerun: NCCL says why"), Sure.LIKELY),
    _m("unused-parameters", ("Expected to have finished reduction",),
       r"Expected to have finished reduction in the prior iteration", K.UNUSED_PARAMETERS, C.UNUSED_PARAMETERS, P.ROOT,
       "the model has parameters that did not take part in the loss, so DDP's reduction never finished",
       change("DistributedDataParallel(model, find_unused_parameters=True), or make every parameter reach the loss")),
    _m("gloo-unsupported", ("does not support", "not implemented", "not supported"),
       # c10d's Backend.hpp: "Backend gloo does not support X" (2.x), "ProcessGroup gloo ..." (1.x), Gloo's own
       r"(?:ProcessGroupGloo|(?:Backend|ProcessGroup) gloo) does not support (?P<op>\w+)"
       r"|Work::getFuture not implemented|(?P<op2>\w+) is not supported (?:by|on|with) (?:the )?Gloo",
       K.UNSUPPORTED, C.GLOO_UNSUPPORTED, P.ROOT,
       "Gloo does not implement this collective",
       change("use the nccl backend for it, or build it from collectives Gloo has (all_gather, then a local reduce)")),
    # Gloo's pair (transport/tcp/pair.cc): a message longer than the receive buffer its collective posted;
    # recorded on the lab (tests/unit/artifacts/logs/size: rank 1 all_reduces a longer tensor, rank 0 aborts)
    _m("gloo-size-mismatch", ("doesn't match expected size", "op.preamble.length"),
       r"op\.preamble\.length <= op\.nbytes\.(?: (?P<got>\d+) vs (?P<expected>\d+)\.)?"
       r"|Received data size doesn't match expected size",
       K.MISMATCH, C.DIFFERENT_COLLECTIVES, P.ROOT,
       "Gloo received more bytes than its collective expected: the ranks issued collectives of different sizes "
       "(or different collectives) at one point",
       change("make every rank issue the same collectives with the same tensor shapes in the same order (a "
              "rank-dependent shape, uneven data, a rank-0-only call)")),
    _m("mismatch-report", ("Detected mismatch between collectives",),
       r"Detected mismatch between collectives on ranks\.(?: Rank (?P<a>\d+) is running collective: (?P<one>Collective"
       r"FingerPrint\([^)]*\)?)(?:, but Rank (?P<b>\d+) is running collective: (?P<two>CollectiveFingerPrint\([^)]*\)?))?)?",
       K.MISMATCH, C.DIFFERENT_COLLECTIVES, P.ROOT,
       "TORCH_DISTRIBUTED_DEBUG=DETAIL saw two ranks issue different collectives (op, shape or sequence number)",
       change("make every rank issue the same collectives in the same order (a rank-dependent branch, a log "
              "call on rank 0 only, uneven data)")),
    _m("nccl-mismatched-collective", ("Mismatched collective detected",), r"Mismatched collective detected, please check "
       r"your collective calls at and around rank (?P<rank>\d+)", K.MISMATCH, C.DIFFERENT_COLLECTIVES, P.ROOT,
       "NCCL (before 2.5) saw ranks call different collectives or sizes near this rank",
       change("make every rank issue the same collectives in the same order, with the same sizes (a rank-dependent "
              "branch, uneven data)"), Sure.LIKELY),
    _m("cuda-oom", ("out of memory", "OutOfMemoryError"),
       r"(?:OutOfMemoryError: )?CUDA out of memory\.(?: Tried to allocate (?P<size>[\d.]+ \w+)(?:\.? ?\(?GPU (?P<gpu>\d+))?)?"
       r"|OutOfMemoryError|Cuda failure (?:\d+ )?'out of memory'|CUDA error: out of memory",
       K.OOM_CUDA, C.CUDA_OOM, P.ROOT,
       "a GPU ran out of memory", change("a smaller batch per GPU, activation checkpointing, or "
                                         "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"), Sure.LIKELY),
    _m("host-oom", ("Out of memory: Killed", "oom-kill", "oom_kill", "oom-killer"),
       r"Out of memory: Killed process (?P<pid>\d+)|oom-kill:|Detected \d+ oom[-_]kill event|invoked oom-killer",
       K.OOM_HOST, C.HOST_OOM, P.ROOT, "the kernel's OOM killer ended a process: the host ran out of memory",
       change("fewer DataLoader workers or ranks per node, a smaller batch, or more host memory")),
    _m("store-connect-timeout", ("connect() timed out",), r"connect\(\) timed out\.(?: Original timeout was "
       r"(?P<ms>\d+) ?ms)?", K.STORE_TIMEOUT, C.STORE_UNREACHABLE, P.ROOT,
       "a process could not reach the store (MASTER_ADDR:MASTER_PORT) before the timeout (torch 1.x's TCPStore)",
       run("ddp-preflight MASTER WORKER ... --only master-reachable", note="says which node cannot reach which port"),
       Sure.LIKELY),
    _m("store-wait-timeout", ("Wait timeout", "wait timeout after", "Socket Timeout"), r"\bWait timeout\b|wait "
       r"timeout after (?P<ms>\d+) ?ms|(?:RuntimeError|DistStoreError): Socket Timeout", K.STORE_TIMEOUT, C.NEVER_JOINED, P.ROOT,
       "a rank waited in the store for its peers' addresses at init: some rank never reached init_process_group",
       run("ddp-preflight explain <every node's log>", note="the rank that never reached init_process_group"),
       Sure.LIKELY),
    _m("dataloader-bus-error", ("bus error", "Bus error"), r"DataLoader worker \(pid:? ?\d+\) is killed by signal: "
       r"Bus error|Unexpected bus error encountered in worker", K.CRASHED, C.SHARED_MEMORY, P.ROOT,
       "a DataLoader worker died of a bus error: the shared memory its batches travel through (/dev/shm) is too small",
       change("a larger /dev/shm (docker run --shm-size=16g), or DataLoader(num_workers=0)")),
    _m("dataloader-killed", ("is killed by signal",), r"DataLoader worker \(pid:? ?\d+\) is killed by signal: "
       r"Killed", K.SIGNAL_KILLED, C.SIGKILL, P.ROOT,
       "a DataLoader worker was killed by SIGKILL: likely the host's OOM killer (each worker holds its own copy of "
       "what the dataset keeps in memory)", run("dmesg -T | grep -iE 'out of memory|killed process'",
                                                note="then fewer DataLoader workers or ranks per node"), Sure.LIKELY),
    # ... in torch's words, or the worker's own (its SIGSEGV handler prints "ERROR: Unexpected segmentation fault ...")
    _m("dataloader-segfault", ("is killed by signal", "Unexpected segmentation fault"), r"DataLoader worker \(pid:? ?\d+\) "
       r"is killed by signal: Segmentation fault|Unexpected segmentation fault encountered in worker", K.CRASHED,
       C.SEGFAULT, P.ROOT, "a DataLoader worker crashed with SIGSEGV", _WORKER_CRASHED),
    _m("dataloader-abort", ("is killed by signal",), r"DataLoader worker \(pid:? ?\d+\) is killed by signal: Abort",
       K.CRASHED, C.ABORT, P.ROOT, "a DataLoader worker aborted (SIGABRT)", _WORKER_CRASHED),
    _m("local-rank-option", ("unrecognized arguments",), r"error: unrecognized arguments:[^\n]*?--local[-_]rank",
       K.EXITED, C.LOCAL_RANK_OPTION, P.ROOT,
       "the launcher passed --local-rank (torchrun, torch>=2.0's launch) or --local_rank to a script whose parser "
       "does not take that spelling",
       change("read os.environ['LOCAL_RANK'], or parser.add_argument('--local-rank', '--local_rank', type=int)")),
    _m("store-barrier", ("store based barrier",), r"store based barrier[^\n]*?\(world_size=(?P<world>\d+), "
       r"worker_count=(?P<count>\d+)", K.STORE_TIMEOUT, C.NEVER_JOINED, P.ROOT,
       "init_process_group's store barrier counted another number of processes than the world size",
       change("launch exactly world_size processes, once (not srun and a launcher both), on a fresh store port"),
       Sure.LIKELY),
    _m("nccl-rank-twice", ("has already checked in",), r"Bootstrap Root : rank (?P<rank>\d+) of (?P<world>\d+) ranks has "
       r"already checked in", K.NCCL_ERROR, C.EXTRA_PROCESSES, P.ROOT,
       "two processes checked in to NCCL's bootstrap as the same rank: the job was launched twice (srun and a "
       "launcher both, or more tasks per node than the launcher expects)",
       change("launch exactly world_size processes, once (not srun and a launcher both), on a fresh store port"),
       Sure.LIKELY),
    # a rank that reached a group's first NCCL collective waits in the store for the group's rank 0's NCCL id:
    # it has the store; the other never got there (its group rank; the global one in the default group)
    _m("nccl-id-wait", ("ncclUniqueId",), r"\[(?P<rank>\d+)\] is setting up NCCL communicator and retr(?:ie|ei)ving ncclUniqueId "
       r"from \[(?P<root>\d+)\] via c10d key-value store by key '[^']*', but store->get\('[^']*'\) got error: "
       r"(?:wait timeout|Socket Timeout|Timeout waiting)", K.RANK_BEHIND, C.BEHIND, P.ROOT, "a rank waited for the "
       "group's first rank to publish its NCCL id: that rank never reached the group's first collective",
       run("ddp-preflight explain <every node's log>", note="the waited-for rank's own output says where it was"),
       Sure.LIKELY),
    _m("store-client-timeout", ("client socket has timed out", "TCP client failed to connect", "RendezvousConnection",
       "RendezvousTimeout", "waiting for clients", "waiting for workers", "client socket has failed to connect"),
       r"client socket has timed out after (?P<after>[\d.]+\s*m?s) while trying to connect to \(?(?P<host>[^,)\s]+)"
       r"(?:, |:)(?P<port>\d+)|TCP client failed to connect/validate to host (?P<host2>[^:\s]+):(?P<port2>\d+)"
       r"|client socket has failed to connect to (?:(?:any network address of \(|\[)(?P<host3>[^,\]\s]+)(?:, ?|\]:)"
       r"(?P<port3>\d+))?|RendezvousConnectionError|RendezvousTimeoutError|Timed out after \d+ seconds waiting for "
       r"(?:clients|workers)",
       K.STORE_TIMEOUT, C.STORE_UNREACHABLE, P.ROOT,
       "a process could not reach the store (MASTER_ADDR:MASTER_PORT) before the timeout: the master was not up, "
       "the address is wrong, or a firewall drops the port",
       run("ddp-preflight MASTER WORKER ... --only master-reachable", note="says which node cannot reach which port"),
       Sure.LIKELY),
    _m("watchdog", ("Watchdog caught", "Caught collective operation timeout", "collective operation timeout",
                    "timed out in blocking wait"),
       r"[Cc]aught collective operation timeout: WorkNCCL\((?:SeqNum=(?P<seq>\d+), )?OpType=(?P<op>\w+)"
       r"(?:[^)]*?Timeout\(ms\)=(?P<timeout>\d+))?"
       r"|Work WorkNCCL\(SeqNum=(?P<seq2>\d+), OpType=(?P<op2>\w+).*?\) timed out in blocking wait",
       K.TIMEOUT_UNKNOWN_ROOT, C.COLLECT_FLIGHT_RECORDER, P.TIMEOUT,
       "a collective waited past the process group's timeout: some rank never entered it", _FLIGHT, Sure.UNKNOWN),
    _m("watchdog-status", ("detected by watchdog", "Timeout at NCCL work"),
       r"(?:detected by watchdog at work(?: sequence id)?|Timeout at NCCL work): (?P<seq>\d+)",
       K.TIMEOUT_UNKNOWN_ROOT, C.COLLECT_FLIGHT_RECORDER, P.TIMEOUT,
       "the watchdog's word on a rank's process group", _FLIGHT, Sure.UNKNOWN),
    _m("nccl-failed-or-timed-out", ("Some NCCL operations have failed or timed out",),
       r"Some NCCL operations have failed or timed out", K.TIMEOUT_UNKNOWN_ROOT, C.UNKNOWN, P.TIMEOUT,
       "NCCL's word on an error or a timeout alike: alone it says neither which nor who",
       run("export NCCL_DEBUG=INFO TORCH_NCCL_DUMP_ON_TIMEOUT=1", note="and keep every rank's log"), Sure.UNKNOWN),
    _m("gloo-timeout", ("Timed out waiting",), r"Timed out waiting (?P<ms>\d+) ?ms for (?:recv|send) operation",
       K.TIMEOUT_UNKNOWN_ROOT, C.UNKNOWN, P.TIMEOUT,
       "a Gloo collective waited past the process group's timeout: some rank never sent or never came",
       run("ddp-preflight explain <every node's log>", note="the rank that did not wait is the one the others waited for"),
       Sure.UNKNOWN),
    _m("nccl-timed-out", ("communicator was aborted", "watchdog got stuck", "watchdog hang", "Heartbeat monitor timed out"),
       r"communicator was aborted|watchdog got stuck|ProcessGroupNCCL watchdog hang|Heartbeat monitor timed out",
       K.TIMEOUT_UNKNOWN_ROOT, C.COLLECT_FLIGHT_RECORDER, P.TIMEOUT,
       "a collective failed or timed out on this rank", _FLIGHT, Sure.UNKNOWN),
    # torchrun's agent on a Ctrl-C (SIGINT) (torch 1.9+), a bare KeyboardInterrupt: a person stopped a stuck run
    _m("stopped-by-hand", ("got signal: 2", "death signal", "KeyboardInterrupt"),
       r"SignalException: Process \d+ got signal: 2\b|Received (?:2|Signals\.SIGINT) death signal"
       r"|(?:^|\s)KeyboardInterrupt\s*$",
       K.TIMEOUT_UNKNOWN_ROOT, C.COLLECT_FLIGHT_RECORDER, P.TIMEOUT,
       "the run was stopped by hand (Ctrl-C): if it hung, no line here says who it waited for",
       _FLIGHT, Sure.UNKNOWN),
    _m("scheduler-stopped", ("CANCELLED AT", ": Terminated"), r"\*\*\* (?:STEP|JOB) \S+ ON \S+ CANCELLED AT \S+ "
       r"(?!DUE TO (?:TIME LIMIT|PREEMPTION|NODE FAILURE))|srun: error: \S+: tasks? [\d,-]+: Terminated", K.TIMEOUT_UNKNOWN_ROOT,
       C.COLLECT_FLIGHT_RECORDER, P.TIMEOUT, "Slurm stopped the step: if it hung, no line here says who it waited for",
       _FLIGHT, Sure.UNKNOWN),
    # c10's fatal signal handler (torch's own, per thread: "SIGABRT(6), PID: 18613, Thread 18613:"), and
    # std::terminate's word before an abort
    _m("fatal-signal", ("), PID: ", "terminate called without"), r"\b(?P<signal>SIG(?:SEGV|ABRT|BUS))\(\d+\), PID: \d+,"
       r" Thread \d+:|terminate called without an active exception", K.CRASHED, C.ABORT, P.ROOT,
       "a process died of a fatal signal (c10's handler prints every thread's stack)", None, Sure.LIKELY),
    _m("segfault", ("Segmentation fault",), r"Fatal Python error: Segmentation fault|Segmentation fault \(core dumped\)",
       K.CRASHED, C.SEGFAULT, P.ROOT, "a process crashed with SIGSEGV (a segmentation fault in native code)",
       run("export PYTHONFAULTHANDLER=1 TORCH_SHOW_CPP_STACKTRACES=1", note="and rerun: the stack of the crash"),
       Sure.LIKELY),
    _m("abort", ("Fatal Python error: Aborted",), r"Fatal Python error: Aborted", K.CRASHED, C.ABORT, P.ROOT,
       "a process aborted (SIGABRT: a C++ exception or a failed assert in native code)",
       run("export TORCH_SHOW_CPP_STACKTRACES=1", note="and rerun: what native code aborted"), Sure.LIKELY),
    _m("monitored-barrier", ("monitoredBarrier",), r"received errors while waiting for send/recv from rank (?P<rank>\d+)",
       K.EXITED, C.UNKNOWN, P.ROOT, "monitored_barrier's word: this rank failed before the barrier",
       run("ddp-preflight explain <that rank's log>", note="its own output says why it never reached the barrier"),
       Sure.LIKELY),
    _m("launcher-killing", ("Killing subprocess",), r"Killing subprocess (?P<pid>\d+)", K.EXITED, C.UNKNOWN, P.VICTIM,
       "DeepSpeed's launcher stopped its ranks because one of them ended: that rank's own output says why",
       run("grep -n -B30 'Killing subprocess' <the log>", note="the first rank's error is above the launcher's lines"),
       Sure.UNKNOWN),
    # torchrun (its logging, glog and bracketed forms) and mp.spawn stopping the other ranks after one ended
    _m("launcher-stopping", ("closing signal SIG", "via signal SIG"), r"Sending process (?P<pid>\d+) closing signal "
       r"SIG(?:TERM|INT)|(?:Closing|Terminating) process (?P<pid2>\d+) via signal SIG(?:TERM|INT)", K.EXITED, C.UNKNOWN,
       P.VICTIM, "the launcher stopped these ranks because another one ended: that rank's own lines say why",
       run("grep -n -B30 'closing signal SIGTERM\\|via signal SIGTERM' <the log>",
           note="the rank that ended first is above the launcher's lines"), Sure.UNKNOWN),
    _m("lost-peer", ("Connection closed by peer", "Connection reset by peer", "Read error", "Broken pipe",
                     "Connection closed by remote peer"),
       r"Connection (?:closed|reset) by (?:remote )?peer|Read error|Broken pipe", K.EXITED, C.UNKNOWN, P.VICTIM,
       "this rank lost its peer: the peer ended first, or the link failed",
       run("ddp-preflight explain <every node's log>", note="the peer that ended first is in another rank's output"),
       Sure.UNKNOWN),
) + NCCL_WORDS + PARTIAL + STOPPED + ANALYZER

BY_ID = {m.id: m for m in CATALOGUE}
# Every message's words in one search: most lines of a log hold none (about 2 us a line, where
# trying each message would take 20 times that)
ANY_WORD = re.compile("|".join(re.escape(w) for w in sorted({w for m in CATALOGUE for w in m.words})))


@dataclass(frozen=True)
class Found:
    """A catalogued message found in a line, with what its words name."""
    message: Message
    groups: dict[str, str]


def find(text: str) -> list[Found]:
    """The catalogued messages this line holds (lines run together in pastes: each message once)."""
    if ANY_WORD.search(text) is None:
        return []
    out = []
    for message in CATALOGUE:
        if not any(w in text for w in message.words):
            continue
        found = message.pattern.search(text)
        if found is not None:
            out.append(Found(message, {k: v for k, v in found.groupdict().items() if v is not None}))
    return out


def id_of(text: str) -> str | None:
    """The id of the first catalogued message in these words (an exception's "Type: message")."""
    found = find(text)
    return found[0].message.id if found else None


def says(id: str, text: str) -> bool:
    """One of this catalogued message's words is in the text (its cheap search, without the pattern:
    "ss_family" tells Gloo's address-family mismatch, however the rest of it was cut)."""
    return any(w in text for w in BY_ID[id].words)


# What to do, or collect, when a launcher's word on how a rank ended is all there is.
ENDED_FIXES = {
    Cause.SIGKILL: run("dmesg -T | grep -iE 'out of memory|killed process'",
                       note="on that rank's node: the kernel's OOM killer says so; else the scheduler's log (sacct)"),
    Cause.SEGFAULT: run("export PYTHONFAULTHANDLER=1 TORCH_SHOW_CPP_STACKTRACES=1", note="and rerun: the stack of the crash"),
    Cause.ABORT: run("export TORCH_SHOW_CPP_STACKTRACES=1", note="and rerun: what native code aborted"),
    Cause.BUS_ERROR: run("df -h /dev/shm", note="on that rank's node: a full /dev/shm is the usual SIGBUS (docker run "
                                                 "--shm-size=16g); else a file the rank had mapped changed under it"),
    Cause.UNKNOWN: run("torchrun --log-dir=LOGS --tee=3 ...", note="keeps each rank's own output: it says why it exited"),
}


# How a launcher says a rank ended (Part.EXIT): torchrun's line on the first failure it saw, in its
# old logging form (ERROR:torch.distributed.elastic.multiprocessing.api:failed ...) and its glog form
# (E1126 ... api.py:882] failed ...) alike, its ChildFailedError table's fields (also flattened by a
# paste: "rank2 (local rank: 2)exitcode: -9"), and DeepSpeed's launcher. A negative code is a signal.
FAILED_LINE = re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>\d+) \(pid: (?P<pid>\d+)\)")
DEEPSPEED_EXIT = re.compile(r"(?:--local_rank=(?P<local>\d+)[^\n]*?)?exits with return code = (?P<code>-?\d+)")
TABLE_ENTRY = re.compile(r"^\[(?P<index>\d+)\]:\s*$")
TABLE_ROOT = "Root Cause (first observed failure)"
TABLE_FIELDS = re.compile(
    r"\brank\s*:?\s*(?P<rank>\d+) \(local[_ ]rank: (?P<local>\d+)\)"
    r"|\bexitcode\s*:?\s*(?P<code>-?\d+) \(pid: (?P<pid>\d+)\)"
    r"|\b[Ss]ignal (?P<signum>\d+) \((?P<signal>SIG\w+)\) received by PID (?P<sigpid>\d+)"
    r"|\btime\s*:\s*(?P<time>\d{4}-\d\d-\d\d[_ ]\d\d:\d\d:\d\d)"
    r"|\bhost\s*:\s*(?P<host>[\w.-]+)")
# The process group a watchdog line is about: torch 2.4's "[PG 1 Rank 0]", 2.5's "[PG ID 0 PG GUID
# 0(default_pg) Rank 1]" (older lines say none: their groups cannot be told apart).
PROCESS_GROUP = re.compile(r"\[PG (?:ID )?(?P<pg>\d+)[^\]]*?Rank (?P<rank>\d+)\]")



# Every word a failure message is told by: the catalogue's, and those of the messages read in their
# own form. No module outside rules/ matches one itself (tests/unit/test_layers.py).
WORDS = tuple(sorted({w for m in CATALOGUE for w in m.words} | {
    "connectFullMesh", "EADDRINUSE", "ddress already in use", "waiting for clients", "client socket has timed out",
    "RendezvousTimeoutError", "not implemented", "does not support", "is not supported", ": error: ", "NCCL error",
    "ncclInvalidUsage", "ncclSystemError", "ncclInternalError", "ncclUnhandledCudaError", "OutOfMemoryError",
    "Timed out waiting", "WorkNCCL", "Watchdog caught", "last enqueued", "Out of memory: Killed", "oom_kill",
    "oom-kill", *LOST_PEER_ALWAYS, "Connection reset by peer", "Broken pipe", "Read error", "Write error",
    "Connection refused", "No route to host", "Network is unreachable", "Connect timeout", "Failed to recv",
    "Failed to send", "wait timeout after", "Duplicate GPU", "device ordinal", "DistNetworkError", "DistStoreError",
    "failed (exitcode", DEEPSPEED_EXIT_WORD, "Root Cause (first observed failure)", "ChildFailedError:"}))
