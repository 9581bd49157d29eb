"""What one rank is doing, from its Python stack (py-spy), its CPU and its kernel wait channel.

Pure: a function of one sample. A victim and a culprit can both sit at 0% CPU, so the stack
decides, never the CPU alone."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ddp_preflight.node.protocol import ExitStatus
from ddp_preflight.node.pyspy import main_thread

from .model import Evidence, RankStatus, Reason
from .model import RankStatus as S

# torch.distributed's Python entry points, by the name users know them by.
COLLECTIVES = {
    "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "all_gather": "all_gather", "all_gather_into_tensor": "all_gather", "_all_gather_base": "all_gather",
    "all_gather_object": "all_gather", "broadcast": "broadcast", "broadcast_object_list": "broadcast",
    "barrier": "barrier", "monitored_barrier": "barrier", "reduce": "reduce", "gather": "gather",
    "scatter": "scatter", "all_to_all": "all_to_all", "all_to_all_single": "all_to_all",
    "send": "send/recv", "recv": "send/recv", "isend": "send/recv", "irecv": "send/recv",
    "batch_isend_irecv": "send/recv",
}
RENDEZVOUS = {"init_process_group", "_new_process_group_helper", "new_group", "rendezvous",
              "_store_based_barrier", "_create_c10d_store", "next_rendezvous", "_rendezvous"}
DISTRIBUTED_FILES = ("torch/distributed/",)
# torch's code that calls c10d (the collectives, the store, DDP's reducer and buffer broadcasts): a
# thread whose innermost Python frame is here and that uses no CPU is blocked in the C++ call its
# line makes, whatever wraps it (DDP's forward, FSDP, a collective's logging wrapper).
COLLECTIVE_CODE = DISTRIBUTED_FILES + ("torch/nn/parallel/distributed.py",)
# Waits that happen in C++ under a Python frame of the user's own (work.wait() inside a wrapper,
# a future's wait(), the store's get, a CUDA synchronisation): seen in native frames only. The
# innermost match wins. (symbols, state, what it waits in)
NATIVE_WAITS = (
    (("c10d::Work::wait", "AsyncWork::wait", "WorkNCCL::wait", "WorkNCCL::synchronize"), S.COLLECTIVE, "Work.wait()"),
    (("PythonFutureWrapper::wait", "ivalue::Future::wait"), S.COLLECTIVE, "Future.wait()"),
    (("TCPStore::doWait", "TCPStore::get", "TCPStore::wait"), S.COLLECTIVE, "store.get()"),
    (("gloo::transport::",), S.COLLECTIVE, "a Gloo transfer"),
    (("ncclCommInitRank", "ncclCommSplit"), S.RENDEZVOUS, "NCCL's communicator setup"),
    (("cuStreamSynchronize", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cuCtxSynchronize",
      "cudaEventSynchronize", "cuEventSynchronize"), S.GPU_WAIT, None),
)
# What a wait on an async handle does not say: which collective (any op it could be is the same).
GENERIC_WAITS = frozenset({"Work.wait()", "Future.wait()", "store.get()", "a Gloo transfer"})
# A wait outside any collective on a lock, an event, a condition or a queue: the standard library's
# frames of it (Python 3.8-3.13), and the C functions under a bare Lock.acquire() (native frames).
LOCK_FRAMES = {("threading.py", "wait"), ("threading.py", "acquire"), ("threading.py", "join"),
               ("threading.py", "_wait_for_tstate_lock"), ("queue.py", "get"), ("queue.py", "put")}
LOCK_SYMBOLS = ("PyThread_acquire_lock", "lock_PyThread_acquire_lock", "acquire_timed", "rlock_acquire")
COMPILING_FILES = ("torch/_dynamo/", "torch/_inductor/")
IMPORT_MACHINERY = ("<frozen importlib._bootstrap",)      # _bootstrap and _bootstrap_external
DATA_FILES = ("torch/utils/data/",)
BACKWARD_FILES = ("torch/autograd/", "torch/_tensor.py")
SAVING_FILES = ("torch/serialization.py", "torch/distributed/checkpoint/", "safetensors/")
# Percent of one core above which a rank is doing something, not waiting. Low on purpose: ranks
# that share cores, or wait on a disk, work at a fraction of a core; a rank blocked in a
# collective or asleep sits near 0. A rank that does anything is never a deadlock's culprit.
BUSY_CPU = 5.0
# The kernel's wait channel of a read that blocks, when its system call is not known: what it reads.
READ_WAITS = {"anon_pipe_read": "a pipe", "pipe_read": "a pipe", "pipe_wait": "a pipe", "n_tty_read": "a terminal",
              "sk_wait_data": "a socket"}
STDLIB = re.compile(r"/lib/python3\.\d+/")       # the standard library's folder (site-packages aside)


@dataclass(frozen=True)
class Frame:
    function: str
    file: str          # as py-spy's short_filename: relative to site-packages where it can
    line: int
    path: str = ""     # the full file name, which says whether it is installed code
    in_loop: bool | None = None   # the line sits inside a for/while body (node/loops.py; None: not read)
    waits_on: str | None = None   # "lock": the line acquires a lock if it waits (node/loops.py)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def native(self) -> bool:
        """A C/C++ frame (py-spy --native): a shared library, or a C source file of Python's own
        (selectmodule.c:655), never the training's line."""
        return self.line == 0 or ".so" in self.file or self.file.endswith((".c", ".cc", ".cpp", ".cxx", ".h"))

    @property
    def in_library(self) -> bool:
        """Installed code (torch, other packages, the standard library), not the training's own."""
        path = self.path or self.file
        return (self.native or self.file.startswith(("torch/", "threading.py", "multiprocessing/", "<frozen"))
                or "-packages/" in path or bool(STDLIB.search(path)))


@dataclass(frozen=True)
class RankState:
    state: RankStatus
    op: str | None = None        # the collective (or the wait) for COLLECTIVE; the CUDA call for GPU_WAIT
    frame: Frame | None = None   # the innermost frame of the training code: "the line"
    evidence: tuple[str, ...] = field(default_factory=tuple)
    reason: Reason | None = None  # what an idle rank waits on, when its stack shows it (a lock)
    exit: ExitStatus | None = None  # how it ended, when it did
    unseen: str | None = None     # why nobody sees it, for UNKNOWN (Evidence.unseen)

    def __post_init__(self):
        object.__setattr__(self, "state", RankStatus(self.state))     # also when given its word

    def as_evidence(self, node: str, pid: int, rank: int | None, **more) -> Evidence:
        """This rank's evidence, as a verdict reads it."""
        if self.state is S.EXITED and self.exit is not None:
            more.setdefault("exit", self.exit)
        if self.state is S.UNKNOWN and self.unseen is not None:
            more.setdefault("unseen", self.unseen)
        return Evidence(node, pid, rank, self.state, self.reason, self.op, self.frame.where if self.frame else None,
                        self.frame.function if self.frame else None, notes=self.evidence, **more)

    def describe(self) -> str:
        where = f" at {self.frame.where} ({self.frame.function})" if self.frame else ""
        if self.state is S.GPU_WAIT:
            return f"waiting on its GPU ({self.op}){where}"
        if self.state is S.IMPORTING:
            return f"importing {self.op}{where}"
        return f"{self.op if self.state is S.COLLECTIVE else self.state.value}{where}"


def frames_of(dump: list[dict]) -> list[Frame]:
    """The main thread's frames from `py-spy dump --json`, innermost first (found by its thread id,
    not its name, which the script may have changed)."""
    main = main_thread(dump)
    if main is None:
        return []
    return [Frame(f["name"], f.get("short_filename") or f["filename"], f["line"], f.get("filename") or "",
                  f.get("in_loop") if isinstance(f.get("in_loop"), bool) else None,
                  "lock" if f.get("waits_on") == "lock" else None)
            for f in main["frames"]]


KEPT_MAX = 16384          # classifications kept (a stall's ranks mostly share a few stacks)
_kept: dict[tuple, RankState] = {}


def classify(dump: list[dict] | None, cpu_percent: float | None, wchan: str | None = None,
             exit_code: int | None = None, waits_in: dict | None = None,
             frames: list[Frame] | None = None) -> RankState:
    """What a rank does, from its stack (frames: frames_of(dump), when the caller holds them: a
    track's, read once per stack), its CPU, its kernel wait and its blocking call.

    A pure function of those, so an answer is kept by them: the ranks of a stall wait at a few
    places, and classifying 4,096 equal stacks one by one took most of a second of the verdict's
    tick (issue 36). The CPU counts as what the answer reads of it: its whole percent (the
    evidence's words) and whether it is busy."""
    if exit_code is not None or dump is None:
        return _classify(dump, cpu_percent, wchan, exit_code, waits_in, frames)
    frames = frames_of(dump) if frames is None else frames
    try:
        key = (tuple(frames), None if cpu_percent is None else (f"{cpu_percent:.0f}", cpu_percent >= BUSY_CPU),
               wchan, None if waits_in is None else tuple(sorted(waits_in.items())))
        found = _kept.get(key)
    except TypeError:            # a value in its blocking call that is no key: classified afresh
        return _classify(dump, cpu_percent, wchan, exit_code, waits_in, frames)
    if found is None:
        if len(_kept) >= KEPT_MAX:
            _kept.clear()
        found = _kept[key] = _classify(dump, cpu_percent, wchan, exit_code, waits_in, frames)
    return found


def _classify(dump: list[dict] | None, cpu_percent: float | None, wchan: str | None = None,
              exit_code: int | None = None, waits_in: dict | None = None,
              frames: list[Frame] | None = None) -> RankState:
    if exit_code is not None:
        return RankState(S.EXITED, evidence=(f"exit code {exit_code}",), exit=ExitStatus(code=exit_code))
    if dump is None:
        why = "no stack: py-spy could not read this process"
        return RankState(S.UNKNOWN, evidence=(why,), unseen=why)
    frames = frames_of(dump) if frames is None else frames
    user = next((f for f in frames if not f.in_library), None)
    evidence = [f"CPU {cpu_percent:.0f}%" if cpu_percent is not None else "CPU unknown"]
    if wchan:
        evidence.append(f"waiting in the kernel at {wchan}")
    importing = _importing(frames)
    for i, frame in enumerate(frames):
        if frame.native and "c10d::Reducer" in frame.function:
            return RankState(S.COLLECTIVE, "all_reduce", user, tuple(evidence + [
                f"DDP's gradient all_reduce: backward waits in {frame.function.split('(')[0]} (native frame)"]))
        if frame.native:
            for symbols, state, what in NATIVE_WAITS:
                if any(symbol in frame.function for symbol in symbols):
                    name = frame.function.split("(")[0]
                    if what in GENERIC_WAITS - {"store.get()"} and \
                            any(f.file.startswith(COLLECTIVE_CODE) for f in frames if not f.native):
                        what = _called(frames)      # torch's own code waits on it: the chain names the collective
                    return RankState(state, what or name, user, tuple(evidence + [f"in {name} (native frame)"]))
        if frame.file.startswith(DISTRIBUTED_FILES):
            if frame.function in RENDEZVOUS:
                return RankState(S.RENDEZVOUS, frame=user, evidence=tuple(evidence + [f"in {frame.function}"]))
            if frame.function in COLLECTIVES:
                op = COLLECTIVES[frame.function]
                return RankState(S.COLLECTIVE, op, user, tuple(evidence + [f"in {frame.function} ({frame.where})"]))
        if importing is not None and i < importing[0]:
            continue         # the imported module's own code (torch._dynamo's is no compiling); what
                             # started the import (torch.compile's set-up) still says what it does
        if frame.file.startswith(COMPILING_FILES):
            return RankState(S.COMPILING, frame=user, evidence=tuple(evidence + [f"in {frame.where}"]))
        if frame.file.startswith(DATA_FILES):
            return RankState(S.LOADING_DATA, frame=user, evidence=tuple(evidence + [f"in {frame.where}"]))
        if frame.file.startswith(SAVING_FILES):
            return RankState(S.SAVING, frame=user, evidence=tuple(evidence + [f"in {frame.where}"]))
    if importing is not None:
        return RankState(S.IMPORTING, importing[1], user, tuple(evidence + [f"importing {importing[1]}"]))
    busy = cpu_percent is not None and cpu_percent >= BUSY_CPU
    inner = next((f for f in frames if not f.native), None)
    if inner is not None and inner.file.startswith(COLLECTIVE_CODE) and not busy:
        return RankState(S.COLLECTIVE, _called(frames), user, tuple(evidence + [f"in {inner.function} ({inner.where})"]))
    lock = _lock_wait(frames) or _own_lock(frames, waits_in)
    if lock is not None and not busy:
        return RankState(S.IDLE, frame=user or (frames[0] if frames else None),
                         evidence=tuple(evidence + [f"waits in {lock}"]), reason=Reason.WAITS_ON_LOCK)
    if frames and frames[0].file.startswith(BACKWARD_FILES) and not busy:
        # backward() with no CPU: DDP's reducer waiting for its gradient all_reduce; without
        # native frames that is likely, not seen.
        return RankState(S.COLLECTIVE, "all_reduce", user, tuple(evidence + [
            f"in backward ({frames[0].where}) without using CPU: likely DDP's gradient all_reduce "
            "(native frames were not taken to confirm)"]))
    blocked = _blocked(waits_in, [f for f in frames if not f.in_library], wchan) if not busy else None
    if blocked is not None:
        why, on, read = blocked
        return RankState(S.IDLE, on, user or (frames[0] if frames else None), tuple(evidence + [read]), reason=why)
    # Idle, its wait not known: at a line inside a loop of its code it has not left the loop (it may
    # go on: its system call was not read in this sample); elsewhere it left it.
    inside = any(f.in_loop for f in frames if not f.in_library)
    return RankState(S.COMPUTING if busy else S.IDLE, frame=user or (frames[0] if frames else None),
                     evidence=tuple(evidence), reason=None if busy else Reason.IDLE_IN_LOOP if inside else Reason.LEFT_LOOP)


def _called(frames: list[Frame]) -> str:
    """The collective a chain of torch's distributed frames is in, by the name users know it by: the
    innermost of them whose function names one ("_distributed_broadcast_coalesced": broadcast), else
    the innermost's own name (DDP's join check)."""
    chain = [f for f in frames if not f.native and f.file.startswith(COLLECTIVE_CODE)]
    for frame in chain:
        name = frame.function.rsplit(".", 1)[-1]
        found = next((op for call, op in COLLECTIVES.items() if re.search(rf"(?:^|_){call}(?:_|$)", name)), None)
        if found is not None:
            return found
    return chain[0].function


def _importing(frames: list[Frame]) -> tuple[int, str] | None:
    """The installed module being imported ("torch._dynamo"), its top-level code running under
    Python's import machinery (a first `import`, or torch's lazy attributes: DDP's constructor
    reaches torch._dynamo), with the index of the outermost import frame (the frames inside it
    are the module's code); None when none is. A module of the training's own that trains as it
    is imported is not "importing": where it is, its own frames say."""
    outermost = max((i for i, f in enumerate(frames) if f.file.startswith(IMPORT_MACHINERY)), default=None)
    if outermost is None:
        return None
    module = next((f for f in reversed(frames[:outermost]) if f.function == "<module>"), None)
    if module is None or not module.in_library:
        return None
    # Named from its path below the folder it is installed in (site-packages, the standard library's).
    name = re.split(r"-packages/|/lib/python3\.\d+/", module.file)[-1].removesuffix(".py").removesuffix("/__init__")
    return outermost, name.strip("/").replace("/", ".")


def _blocked(waits_in: dict | None, own: list[Frame], wchan: str | None = None) -> tuple[Reason, str | None, str] | None:
    """What an idle rank's main thread is blocked in outside any collective, by its system call
    (node/blocked.py): asleep inside a loop of its code (a frame of its own inside a for/while
    body; after its loop it left the loop: uneven data's shape), or reading stdin, a socket, a pipe
    or a terminal (not a collective's: its frames would have said one); where the system call is
    not known, the kernel's wait channel for a read of a pipe, a terminal or a socket. None when
    that says nothing more than "idle"."""
    call = (waits_in or {}).get("call")
    if call == "sleep" and any(f.in_loop for f in own):
        return Reason.SLEEPS, None, "asleep in the kernel (nanosleep: time.sleep)"
    on = str((waits_in or {}).get("on") or "")
    if call == "recv" and on and on != "?":
        what = f"stdin ({_reading(on)})" if (waits_in or {}).get("fd") == 0 else on
        return Reason.WAITS_TO_RECEIVE, what, f"blocked reading {what} (its system call)"
    if call is None and wchan in READ_WAITS:
        what = READ_WAITS[wchan]
        return Reason.WAITS_TO_RECEIVE, what, f"blocked reading {what} (the kernel's wait channel {wchan})"
    return None


def _reading(on: str) -> str:
    """What stdin is, in words: "a pipe", "a terminal", "a socket", a file."""
    if on == "pipe":
        return "a pipe"
    if on.startswith("/dev/pts/") or on.startswith("/dev/tty"):
        return "a terminal"
    if on.startswith("tcp ") or on == "socket":
        return f"a socket, {on}" if on.startswith("tcp ") else "a socket"
    return on


def _own_lock(frames: list[Frame], waits_in: dict | None) -> str | None:
    """A lock the training's own line waits on, with nothing of Python's under it: the line
    acquires one (`lock.acquire()`, `with lock:`: node/loops.py read it) and the kernel has its
    main thread waiting on a futex. Its Python frames then say where it waits; native frames would
    only name the same wait (another C call on that line, a work.wait(), is not one)."""
    first = next((f for f in frames if not f.native), None)
    if first is None or first.in_library or first.waits_on != "lock" or (waits_in or {}).get("call") != "lock":
        return None
    return f"a lock its line acquires ({first.where})"


def _lock_wait(frames: list[Frame]) -> str | None:
    """The lock, event, condition or queue wait the innermost frames show, if they show one before
    any frame of the training's own: "threading.py:355 (wait)"."""
    for frame in frames:
        if frame.native:
            if any(symbol in frame.function for symbol in LOCK_SYMBOLS):
                return frame.function.split("(")[0]
            continue
        name = frame.file.rsplit("/", 1)[-1]
        if (name, frame.function) in LOCK_FRAMES:
            return f"{frame.where} ({frame.function})"
        if not frame.in_library:
            return None
    return None
