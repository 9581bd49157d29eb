"""What nodes say to the master: one line each, `MARKER` + JSON, on stdout. Declared once, here;
the master imports this module too. Lines without a marker are the programs' own output (a
rank's lines under launch), passed on as text.

The job scripts that run inside torchrun's ranks import it from the package's zip as well.

Every marked line is signed with the program's own key (node/signing.py): the master takes a
marked line only when its signature holds, so a rank that writes to its launcher's stdout
cannot speak for the launcher."""

from __future__ import annotations

import json
import sys
import threading
from dataclasses import asdict, dataclass
from typing import Any, Optional

from . import signing

PREFIX = "DDP_PREFLIGHT_"

FACTS = "DDP_PREFLIGHT_FACTS "              # the collectors' result (one line, possibly large)
PROGRESS = "DDP_PREFLIGHT_PROGRESS "        # shard hashing: [done bytes, total, done files, total]
CLOCK = "DDP_PREFLIGHT_CLOCK "              # the node's time.time() as the program starts
JOB = "DDP_PREFLIGHT_JOB "                  # the supervisor's outcome of its job (JobOutcome)
LAUNCH = "DDP_PREFLIGHT_LAUNCH "            # the launch runner: started, ranks, exits, error
READY = "DDP_PREFLIGHT_READY "              # the network probe's listener is up (its ports)
RESULT = "DDP_PREFLIGHT_RESULT "            # the network probe's outcome
COLLECTIVES = "DDP_PREFLIGHT_COLLECTIVES "  # each rank of the collectives job, one line per case
BANDWIDTH = "DDP_PREFLIGHT_BANDWIDTH "      # rank 0 of the bandwidth job
COMPUTE = "DDP_PREFLIGHT_COMPUTE "          # the compute benchmark's figure
AGENT = "DDP_PREFLIGHT_AGENT "              # hangwatch's agent: hello, rank, sample, stacks, exit
FILE = "DDP_PREFLIGHT_FILE "                # a file received (its private path)
LONG = "DDP_PREFLIGHT_LONG "                # {"bytes": N}: this program's next marked line is that long
TAG_ROOM = 64                               # bytes of a signature's tag, " WRITER.N.MAC", at most
LONG_FROM = 60 * 1024                       # bytes of a marked line from which it is announced (the
                                            # reader holds an unannounced one to 64 KiB only)
# The flags of every Python a node program starts, the boot (`python FLAGS -c STAGE0`) first: -I, no
# PYTHON* variable (PYTHONPATH, PYTHONHOME, PYTHONSTARTUP: --env, or a node's environment, would
# otherwise put another user's json.py before the standard library's); no user site (HOME may be
# another user's under sudo), no site at start-up (its .pth files run code; node/trust.py checks
# them first). -I comes first so that a --python that is not a Python reads the rest as before (ls
# takes "-s" as -I's pattern, then says it cannot access STAGE0).
FLAGS = ("-I", "-s", "-S")
PYTHON = "DDP_PREFLIGHT_PYTHON "            # (stderr) what --python is when it cannot run: missing, a folder...
INTERFERED = "DDP_PREFLIGHT_INTERFERED "    # a probe's store held a value no client of this run wrote
GATE = "DDP_PREFLIGHT_GATE "                # a launched rank ran its probes and waits for the master's word

_lock = threading.Lock()


def line(marker: str, data: Any) -> str:
    return marker + json.dumps(data, default=str)


def emit(marker: str, data: Any, stream=None) -> None:
    """One marked line, whole and signed (threads of one program never interleave their lines,
    and a writer's counts reach the pipe in order)."""
    out = stream or sys.stdout
    text = line(marker, data)
    with _lock:
        size = len(text.encode("utf-8")) + TAG_ROOM + 1
        if size > LONG_FROM:
            # Signed first (its count comes before the line's), so its reader can trust it.
            out.write(signing.sign(line(LONG, {"bytes": size})) + "\n")
        out.write(signing.sign(text) + "\n")
        out.flush()


def parse(text: str, marker: str) -> Optional[Any]:
    """The JSON of a line with this marker; None for any other line (or a broken one)."""
    if not text.startswith(marker):
        return None
    try:
        return json.loads(text[len(marker):])
    except ValueError:
        return None


def marked(lines, marker: str) -> list:
    """Every value of the lines with this marker, in order."""
    out = []
    for text in lines:
        value = parse(text, marker)
        if value is not None:
            out.append(value)
    return out


@dataclass(frozen=True)
class ExitStatus:
    """How a process ended: its exit code, or the signal that ended it (one of the two)."""
    code: Optional[int] = None
    signal: Optional[int] = None

    STOPPED = (15, 2, 1)       # SIGTERM, SIGINT, SIGHUP: someone stopped it (Ctrl-C, a launcher)

    @classmethod
    def from_wait_status(cls, status: int) -> "ExitStatus":
        """From a wait status (/proc's exit_code field, os.waitpid)."""
        return cls(signal=status & 0x7F) if status & 0x7F else cls(code=status >> 8)

    @classmethod
    def from_returncode(cls, returncode: int) -> "ExitStatus":
        """From subprocess's returncode (negative: the signal)."""
        return cls(signal=-returncode) if returncode < 0 else cls(code=returncode)

    @property
    def ok(self) -> bool:
        return self.code == 0

    @property
    def stopped(self) -> bool:
        return self.signal in self.STOPPED

    def __str__(self) -> str:
        return f"signal {self.signal}" if self.signal is not None else f"exit code {self.code}"


@dataclass(frozen=True)
class JobOutcome:
    """How a supervised job ended: its exit code or the signal that ended it, whether its time
    bound or the master (a stop, or its silence) ended it, and how long it ran."""
    exit: Optional[int] = None
    signal: Optional[int] = None
    timed_out: bool = False
    stopped: Optional[str] = None     # "asked": the master's stop; "master-silent": its lease ran out
    seconds: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "JobOutcome":
        return cls(exit=data.get("exit"), signal=data.get("signal"), timed_out=bool(data.get("timed_out")),
                   stopped=data.get("stopped"), seconds=float(data.get("seconds") or 0.0))


# -- hangwatch's agent (node/agent.py): AGENT lines, as the watcher reads them --------------------
# The agent writes plain dicts with a "type"; these are what each one means. Parsing tolerates
# what an older or newer agent sends: unknown keys are ignored, missing ones take their default.

@dataclass(frozen=True)
class Hello:
    node: Optional[str] = None
    host: Optional[str] = None
    pid: Optional[int] = None
    uid: Optional[int] = None
    python: Optional[str] = None
    torch: Optional[str] = None
    py_spy: Optional[str] = None            # the py-spy it will run, or None
    py_spy_refused: Optional[str] = None    # why it did not run the one it was given
    time: Optional[float] = None
    missing: tuple = ()                     # the pids it was given (attach --pid) of no process


@dataclass(frozen=True)
class RankFound:
    pid: int
    ppid: Optional[int] = None
    start: int = 0                   # start time in clock ticks: with the pid, names the process
    argv: tuple = ()
    rank: Optional[int] = None
    local_rank: Optional[int] = None
    world_size: Optional[int] = None
    master: Optional[str] = None     # MASTER_ADDR:MASTER_PORT from its environment
    env_readable: bool = True
    env: Any = None                  # its environment, secrets redacted (a dict)
    started: Optional[float] = None  # when it started, the node's clock (epoch s)
    uid: Optional[int] = None        # the user who runs it (its real uid: a setuid program's caller)
    user: Optional[str] = None       # that user's name on its node ("uid N" without one)
    given: bool = False              # a --pid of the watch


@dataclass(frozen=True)
class LauncherFound:
    """A torchrun on the node, as its command line says (ranks are started by it)."""
    pid: int
    start: int = 0
    argv: tuple = ()
    nnodes: Optional[int] = None
    node_rank: Optional[int] = None
    master: Optional[str] = None     # its rendezvous endpoint (MASTER_ADDR:MASTER_PORT)
    nproc_per_node: Optional[int] = None
    started: Optional[float] = None  # the node's clock, epoch s
    uid: Optional[int] = None        # the user who runs it (its real uid)
    user: Optional[str] = None       # that user's name on its node


@dataclass(frozen=True)
class LauncherSample:
    pid: int
    cpu: Optional[float] = None      # % of one core since the last sample
    ranks: int = 0                   # its ranks alive now (ranks whose parent it is)


@dataclass(frozen=True)
class RankSample:
    pid: int
    rank: Optional[int] = None
    state: Optional[str] = None      # /proc's: R, S, D, Z ...
    threads: Optional[int] = None
    wchan: Optional[str] = None
    waits_in: Any = None             # its main thread's blocking system call (node/blocked.py), when asleep
    cpu: Optional[float] = None      # % of one core since the last sample (None: the first)
    exit: Optional[int] = None       # the wait status, when caught as a zombie
    gpu: Optional[int] = None        # the GPU it has a context on (NVML's index), on GPU nodes
    tcp: Optional[int] = None        # its established TCP connections (counted every few samples)
    torch: Optional[bool] = None     # torch's library is mapped in it (with tcp): it imported torch
    io: Optional[float] = None       # bytes/s it read and wrote through system calls (/proc's rchar +
                                     # wchar: sockets, pipes, files); None: not readable, or its
                                     # first sample
    children_cpu: Optional[float] = None   # % of one core its descendants used (DataLoader workers,
                                           # helpers, those that ended since the last sample too);
                                           # None: it has none, or the first sample that has some
    endpoints: Optional[tuple] = None  # its TCP sockets' local "ip:port", when they changed since it
                                       # was last counted (Gloo's pairs: which connection is whose)
    links: Optional[tuple] = None    # its established connections ((local, remote) "ip:port"), when
                                     # they changed since last counted: whose mesh joins it to whom
    wire: Optional[int] = None       # bytes its open TCP connections have carried (acked sent + received,
                                     # node/wire.py): a change between samples is progress
    held: Optional[bool] = None      # the agent's py-spy held it (suspended to read its stack) during
                                     # this sample: its CPU was not its own to use


@dataclass(frozen=True)
class GpuSample:
    index: int
    util: Optional[float] = None          # % of the sample a kernel ran (NVML's utilization.gpu)
    memory_util: Optional[float] = None   # % of the sample memory was read or written


@dataclass(frozen=True)
class Sample:
    t: float = 0.0                   # the node's clock, epoch s
    ranks: tuple = ()                # RankSample
    gone: tuple = ()                 # pids no longer there
    net: Optional[float] = None      # bytes/s on the node's links (loopback aside)
    gpus: tuple = ()                 # GpuSample, on GPU nodes
    launchers: tuple = ()            # LauncherSample
    closures: tuple = ()             # (local, remote) of the node's TIME_WAIT sockets, for 60 s after a
                                     # rank of it ended: the side that closed a connection first holds it


@dataclass(frozen=True)
class Stacks:
    t: float = 0.0
    id: Optional[int] = None         # the watcher's request, or None when the agent took them itself
    stacks: Any = None               # {pid: py-spy's JSON (a list) or {"error": ..., "permission": bool}}
    flight: Any = None               # {pid: Flight Recorder record}
    stores: tuple = ()               # StoreAnswer: the stores of ranks waiting in init_process_group
    sockets: Any = None              # {pid: SocketQueues as a dict}, read with the stacks
    reading: tuple = ()              # the stores (MASTER_ADDR:PORT) being read: a Stores message follows
    partial: tuple = ()              # pids whose stacks here are Python frames alone: their native
                                     # frames follow in a message with the same id (the rest of it)


@dataclass(frozen=True)
class Stores:
    """What the stores of ranks waiting in init_process_group said, read after the stacks that
    showed them there (id: those stacks' request), all together under one deadline."""
    t: float = 0.0
    id: Optional[int] = None
    stores: tuple = ()               # StoreAnswer


@dataclass(frozen=True)
class StoreAnswer:
    """What a rendezvous store said when the agent read it (ddp_preflight/node/store.py)."""
    master: Optional[str] = None     # MASTER_ADDR:MASTER_PORT, from a waiting rank's environment
    world_size: Optional[int] = None
    checked_in: Optional[tuple] = None   # the ranks whose check-in key is there; None: not read
    how: Optional[str] = None        # "list_keys", or "check" (each rank's key, on an older torch)
    error: Optional[str] = None      # why it could not be read
    seconds: Optional[float] = None  # how long the read took
    silent: bool = False             # it gave no answer within the read's deadline


@dataclass(frozen=True)
class SocketQueues:
    """A rank's established TCP connections as the kernel holds them (/proc/net/tcp): bytes
    it sent that the peer has not acknowledged, bytes that arrived that it has not read, and
    how many of its connections the peer has closed (CLOSE_WAIT)."""
    established: int = 0
    unsent: int = 0                  # tx_queue summed: sent, not yet acknowledged by the peer
    unread: int = 0                  # rx_queue summed: arrived, not yet read by the rank
    peer_closed: int = 0             # connections in CLOSE_WAIT: the peer closed, the rank did not
    links: Optional[tuple] = None    # its established connections ((local, remote) "ip:port") as counted
                                     # with its stack (an older agent's: not sent)
    endpoints: Optional[tuple] = None  # its TCP sockets' local "ip:port", counted with them


@dataclass(frozen=True)
class RankExit:
    pid: int
    t: Optional[float] = None
    code: Optional[int] = None       # the wait status, when caught before its parent reaped it
    oom: Optional[bool] = None       # the node's OOM-kill count rose since the last sample in which
                                     # no rank was on its way out (None: not readable)
    output: tuple = ()               # its last output lines, when its stdout/stderr is a file
    ending: Any = None               # how its script ended, as the rank itself recorded it (a dict:
                                     # node/rank_bootstrap.py's record_ending), when it ran under
                                     # ddp-preflight's bootstrap or imported hangwatch.flight
    shared: Optional[bool] = None    # its output file is another process's output too (its torchrun's:
                                     # `torchrun ... > node.log`; another rank's): a line there is its
                                     # own only where its prefix names it ("[rank3]: ")
    closed: Any = None               # {pid: n} for the node's other live ranks at this exit: how many
                                     # fewer TCP sockets each holds than the most it held at a count
                                     # (those its peer closed stay open, CLOSE_WAIT: only its own
                                     # closes count); a rank that closed some was on its way out


@dataclass(frozen=True)
class ClockAnswer:
    """The node's clock, read the moment the watcher's {"cmd": "clock", "t": its clock} arrived: the
    master reads the node's offset (t - the midpoint of asked and answered) to within half the
    round trip."""
    asked: Optional[float] = None    # the master's clock when it asked (echoed)
    t: Optional[float] = None        # the node's clock when it answered


@dataclass(frozen=True)
class PySpyAnswer:
    path: Optional[str] = None
    given: Optional[str] = None
    refused: Optional[str] = None


AGENT_MESSAGES = {"hello": Hello, "rank": RankFound, "sample": Sample, "stacks": Stacks, "stores": Stores,
                  "exit": RankExit, "py-spy": PySpyAnswer, "clock": ClockAnswer, "launcher": LauncherFound}


def agent_message(data: dict):
    """An agent's dict as its typed message; None for a kind this side does not know."""
    cls: Any = AGENT_MESSAGES.get(str(data.get("type")))
    if cls is None:
        return None
    known = set(cls.__dataclass_fields__)
    values = {k: v for k, v in data.items() if k in known}
    if cls is Sample:
        values["ranks"] = tuple(_rank_sample(r) for r in data.get("ranks") or ())
        values["gone"] = tuple(data.get("gone") or ())
        values["gpus"] = tuple(GpuSample(**{k: v for k, v in g.items() if k in GpuSample.__dataclass_fields__})
                               for g in data.get("gpus") or ())
        values["launchers"] = tuple(LauncherSample(**{k: v for k, v in x.items()
                                                      if k in LauncherSample.__dataclass_fields__})
                                    for x in data.get("launchers") or () if isinstance(x, dict))
        values["closures"] = tuple((str(pair[0]), str(pair[1])) for pair in data.get("closures") or ()
                                   if isinstance(pair, (list, tuple)) and len(pair) == 2)
    elif cls in (RankFound, LauncherFound):
        values["argv"] = tuple(data.get("argv") or ())
    elif cls is Hello:
        values["missing"] = tuple(int(pid) for pid in data.get("missing") or () if isinstance(pid, int))
    elif cls is Stacks:
        values["stacks"] = {int(pid): dump for pid, dump in (data.get("stacks") or {}).items()}
        values["flight"] = {int(pid): rec for pid, rec in (data.get("flight") or {}).items()}
        values["stores"] = tuple(_store_answer(a) for a in data.get("stores") or ())
        values["reading"] = tuple(str(m) for m in data.get("reading") or ())
        values["partial"] = tuple(int(pid) for pid in data.get("partial") or ())
        values["sockets"] = {int(pid): _socket_queues(q) for pid, q in (data.get("sockets") or {}).items()
                             if isinstance(q, dict)}
    elif cls is Stores:
        values["stores"] = tuple(_store_answer(a) for a in data.get("stores") or () if isinstance(a, dict))
    elif cls is RankExit:
        values["output"] = tuple(str(line) for line in data.get("output") or ())
        values["closed"] = {int(pid): n for pid, n in (data.get("closed") or {}).items()}
    return cls(**values)


def _rank_sample(data: dict) -> RankSample:
    return RankSample(**_connections({k: v for k, v in data.items() if k in RankSample.__dataclass_fields__}))


def _socket_queues(data: dict) -> SocketQueues:
    return SocketQueues(**_connections({k: v for k, v in data.items() if k in SocketQueues.__dataclass_fields__}))


def _connections(values: Any) -> Any:
    """A rank's `endpoints` ("ip:port") and `links` ((local, remote)) as tuples, where sent."""
    if values.get("endpoints") is not None:
        values["endpoints"] = tuple(str(e) for e in values["endpoints"])
    if values.get("links") is not None:
        values["links"] = tuple((str(link[0]), str(link[1])) for link in values["links"]
                                if isinstance(link, (list, tuple)) and len(link) == 2)
    return values


def _store_answer(data: dict) -> StoreAnswer:
    values = {k: v for k, v in data.items() if k in StoreAnswer.__dataclass_fields__}
    if values.get("checked_in") is not None:
        values["checked_in"] = tuple(values["checked_in"])
    return StoreAnswer(**values)
