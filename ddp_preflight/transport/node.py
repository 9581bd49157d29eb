"""One node, as the master drives it: start a node program (node/programs.py) and stream its lines,
collect facts, run a supervised job, put a file. LocalNode and SshNode differ only in how a
process is started (`_spawn`); everything else is here, once.

Every program is `python -c <boot>` with the node package and its spec written on its stdin
(transport/payload.py): no orders, environments or tokens in any node's process list. A program
that keeps its stdin (a job, hangwatch's agent) gets a heartbeat every second; the node ends what
it started when they stop for longer than the lease (node/control.py).

Each program gets a fresh key in its spec and signs its marked lines with it (node/signing.py);
`Program._line`, the one place every program's lines pass, takes a marked line only when its
signature holds, and passes any other on as the program's text, marked so that no parser takes
it: a rank that writes to its launcher's stdout never speaks for the launcher."""

from __future__ import annotations

import collections
import json
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from ddp_preflight.node import protocol, signing
from ddp_preflight.node.control import HEARTBEAT

from .errors import NodeError, explain_python
from .lines import MAX_LINE, LineSplitter, as_text
from .payload import boot_argv, stdin_payload

OnLine = Callable[[str], None]
Progress = Callable[[str, list], None]     # (node, [done_bytes, total_bytes, done_files, total_files])
TAIL_LINES = 200           # a program's own lines kept for its result (the rest went to on_line)
COLLECT_TIMEOUT = 600.0    # seconds for the facts (hashing a large data folder takes a while)
FACTS_LEASE = 30.0         # seconds of our silence after which the facts program ends itself (node/facts/main.py)


class Process(ABC):
    """One `python -c <boot>` started on a node: a channel or a local subprocess."""

    @abstractmethod
    def write(self, data: bytes) -> bool:
        """Write to its stdin; False when it is closed or gone."""

    @abstractmethod
    def heartbeat(self) -> None:
        """One newline on its stdin, if that can be done without blocking."""

    @abstractmethod
    def close_input(self) -> None: ...

    @abstractmethod
    def read(self) -> bytes:
        """The next chunk of its stdout; b"" at the end."""

    @abstractmethod
    def wait(self, timeout: float | None = None) -> int | None:
        """Its exit status once it has ended; None if `timeout` passed first."""

    @abstractmethod
    def stderr_text(self) -> str:
        """The last few KB of its stderr, once it has ended (waits a moment for the last of it)."""

    @abstractmethod
    def kill(self) -> None: ...


class _Heartbeats:
    """One thread for every program that keeps its stdin: a newline each HEARTBEAT seconds."""

    def __init__(self) -> None:
        self._processes: set[Process] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, process: Process) -> None:
        with self._lock:
            self._processes.add(process)
            if self._thread is None:
                self._thread = threading.Thread(target=self._beat, name="heartbeats", daemon=True)
                self._thread.start()

    def remove(self, process: Process) -> None:
        with self._lock:
            self._processes.discard(process)

    def _beat(self) -> None:
        while True:
            time.sleep(HEARTBEAT)
            with self._lock:
                processes = list(self._processes)
            for process in processes:
                try:
                    process.heartbeat()
                except Exception:
                    pass      # a dropped connection: its reader says so


HEARTBEATS = _Heartbeats()


@dataclass
class ProgramResult:
    exit: int | None                     # the boot process's exit status (None: unknown)
    marked: list[str] = field(default_factory=list)   # its protocol lines, in order
    tail: list[str] = field(default_factory=list)     # its last own lines
    stderr: str = ""
    error: str | None = None             # the connection dropped, or no answer in time

    def values(self, marker: str) -> list:
        return protocol.marked(self.marked, marker)


class Program:
    """A node program, started: its lines go to `on_line` as they come (from a reader thread),
    protocol lines are kept for the result, and only a tail of the rest."""

    def __init__(self, node: str, process: Process, on_line: OnLine | None, keep_input: bool,
                 keep_marked: bool = True, key: str | None = None):
        self.node, self.process, self.on_line = node, process, on_line
        # No key: no marked line is this program's (each is shown as its text).
        self._verifier = signing.Verifier(key or signing.new_key())
        self.keep_input, self.keep_marked = keep_input, keep_marked
        self.started = time.monotonic()
        self._marked: list[str] = []
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._done = threading.Event()
        self._result: ProgramResult | None = None
        self._lock = threading.Lock()
        self._splitter = LineSplitter(max_marked=MAX_LINE)
        if keep_input:
            HEARTBEATS.add(process)
        threading.Thread(target=self._pump, name=f"program-{node}", daemon=True).start()

    def send(self, command: dict) -> bool:
        """A command on the program's control line (hangwatch's agent reads them)."""
        return self.process.write((json.dumps(command) + "\n").encode())

    def stop(self) -> None:
        """Close its stdin: the node program ends what it started (ddp_preflight/node/control.py)."""
        HEARTBEATS.remove(self.process)
        self.process.close_input()

    def kill(self) -> None:
        HEARTBEATS.remove(self.process)
        self.process.kill()

    def wait(self, timeout: float | None = None) -> ProgramResult | None:
        if not self._done.wait(timeout):
            return None
        return self._result

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def _line(self, line: str) -> None:
        # Before anything reads it: a marked line is taken only when this program signed it, and
        # without its tag; any other becomes text that no parser takes for a marked line.
        if line.startswith(protocol.PREFIX):
            signed = self._verifier.check(line)
            line = signed if signed is not None else signing.NOT_SIGNED + as_text(line)
        if line.startswith(protocol.LONG):
            announced = protocol.parse(line, protocol.LONG)
            if isinstance(announced, dict) and isinstance(announced.get("bytes"), int):
                self._splitter.allow(announced["bytes"])
            return
        if line.startswith(protocol.PREFIX):
            if self.keep_marked:
                self._marked.append(line)
        else:
            self._tail.append(line)
        if self.on_line is not None:
            try:
                self.on_line(line)
            except Exception:
                pass      # a broken viewer must not stop the reading of a node

    def _pump(self) -> None:
        # A marked line longer than a text line only once the program announced it (_line).
        splitter, error = self._splitter, None
        try:
            while True:
                chunk = self.process.read()
                if not chunk:
                    break
                for line in splitter.each(chunk):
                    self._line(line)
            for line in splitter.end():
                self._line(line)
        except Exception as exc:     # a dropped connection is this node's news, not a crash
            error = f"the connection dropped: {exc}"
        code = self.process.wait(10)
        HEARTBEATS.remove(self.process)
        if code is None and error is None:
            error = "no exit status from the node"
        self._result = ProgramResult(code, list(self._marked), list(self._tail), self.process.stderr_text(), error)
        self._done.set()


@dataclass
class JobResult:
    """A supervised job's end (ddp_preflight/node/supervisor.py), as probes and the launcher read it."""
    node: str
    exit: int | None = None
    signal: int | None = None
    timed_out: bool = False
    seconds: float = 0.0
    stdout: str = ""                  # its protocol lines and the tail of its own
    stderr: str = ""
    error: str | None = None          # the job could not be started or its outcome was lost
    stopped: str | None = None        # "asked" (the master's stop) or "master-silent"
    marked: list[str] = field(default_factory=list)
    outwaited: float | None = None    # the master's wait of this many seconds for its end ran out, so the
                                      # master stopped it (stopped "asked" then says whose stop it was)

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit == 0 and not self.timed_out

    def json_lines(self, marker: str) -> list:
        return protocol.marked(self.marked, marker)


class RunningJob:
    def __init__(self, program: Program):
        self.program, self.node = program, program.node

    def wait(self, timeout: float | None = None) -> JobResult:
        result = self.program.wait(timeout)
        outwaited = None
        if result is None:
            outwaited = timeout
            self.stop()
            result = self.program.wait(10)
        if result is None:
            return JobResult(self.node, error="the job's outcome was lost")
        outcome = result.values(protocol.JOB)
        error = result.error
        if not outcome and error is None:
            last = (result.stderr.strip().splitlines() or [""])[-1]
            error = "the node's supervisor reported no outcome" + (f": {last}" if last else "")
        done = protocol.JobOutcome.from_json(outcome[-1]) if outcome else protocol.JobOutcome()
        own = [m for m in result.marked if not m.startswith(protocol.JOB)]
        return JobResult(self.node, done.exit, done.signal, done.timed_out, done.seconds,
                         "\n".join(own + result.tail), result.stderr, error, done.stopped, own, outwaited)

    def send(self, command: dict) -> bool:
        """A command on the supervisor's control line ("prepare-stop": node/supervisor.asked)."""
        return self.program.send(command)

    def stop(self) -> None:
        self.program.stop()


class Node(ABC):
    """A machine the master drives. `connect()` first; `close()` at the end."""

    def __init__(self, name: str, python: str):
        self.name, self.python = name, python

    @property
    @abstractmethod
    def address(self) -> str:
        """The address this node is reached at."""

    @abstractmethod
    def connect(self) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    @property
    def is_local(self) -> bool:
        return False

    @abstractmethod
    def _spawn(self, argv: list[str]) -> Process:
        """Start argv on the node with pipes for stdin, stdout and stderr."""

    def _boot(self, spec: dict, data: bytes) -> Process:
        """Start `python -c <boot>` with the payload (and `data`) on its stdin."""
        process = self._spawn(boot_argv(self.python))
        process.write(stdin_payload(spec) + data)
        return process

    def try_command(self, command: str) -> str:
        """How a person runs `command` on this node themselves (in a fix line)."""
        return f"ssh {self.name} {command}"

    # -- what every node does the same way -----------------------------------------------------
    def start(self, spec: dict, *, on_line: OnLine | None = None, keep_input: bool = False,
              data: bytes = b"", keep_marked: bool = True) -> Program:
        """Run a node program with this spec (and `data` after it on its stdin); with keep_input,
        its stdin stays open (heartbeats, commands) until stop(). A program that streams for
        hours (hangwatch's agent) gives its lines to on_line only: keep_marked=False."""
        key = signing.new_key()
        process = self._boot({**spec, "key": key}, data)
        if not keep_input:
            process.close_input()
        return Program(self.name, process, on_line, keep_input, keep_marked, key)

    def job(self, job: dict, *, env: dict | None = None, timeout: float = 60, lease: float | None = None,
            cwd: str | None = None, on_line: OnLine | None = None) -> RunningJob:
        """A node program under the node's supervisor: its own process group, bounded by
        `timeout`, stopped by stop() or by the master's silence for `lease` seconds."""
        spec = {"program": "supervise", "job": job, "env": env or {}, "timeout": timeout,
                "lease": lease, "cwd": cwd}
        return RunningJob(self.start(spec, on_line=on_line, keep_input=True))

    def put_file(self, local: str, name: str, *, mode: int = 0o600, prefix: str = "ddp-preflight-",
                 timeout: float = 120) -> tuple[str, str]:
        """Copy a file of this machine to the node, into a folder made for it there that only this
        user can write (node/receive.py): (its path, its folder). Raises NodeError."""
        with open(local, "rb") as f:
            data = f.read()
        program = self.start({"program": "receive", "name": name, "size": len(data), "mode": mode,
                              "prefix": prefix}, data=data)
        result = program.wait(timeout)
        if result is None:
            program.kill()
            raise NodeError(f"{self.name}: copying {name} took over {timeout:.0f} s")
        placed = result.values(protocol.FILE)
        if not placed:
            last = (result.stderr.strip().splitlines() or [result.error or "no answer"])[-1]
            raise NodeError(f"{self.name}: could not copy {name} there: {last}")
        return placed[-1]["path"], placed[-1]["folder"]

    def collect(self, request: dict, on_progress: Progress | None = None) -> dict:
        """The facts program's result, with the node's clock offset from ours."""
        clock: list[tuple[float, float]] = []

        def on_line(line: str) -> None:
            if line.startswith(protocol.CLOCK):
                clock.append((float(line[len(protocol.CLOCK):]), time.time()))
            elif line.startswith(protocol.PROGRESS) and on_progress is not None:
                on_progress(self.name, json.loads(line[len(protocol.PROGRESS):]))

        try:
            sent = time.time()
            # Its stdin stays open (heartbeats): the facts die with this process (node/facts/main.py).
            program = self.start({"lease": FACTS_LEASE, **request, "program": "facts"}, on_line=on_line,
                                 keep_input=True)
            result = program.wait(COLLECT_TIMEOUT)
            if result is not None:
                program.stop()
        except Exception as exc:
            raise NodeError(f"{self.name}: the collector did not start: {exc}",
                            "try: " + self.try_command(f"{self.python} -c 'import torch'")) from None
        if result is None:
            program.kill()
            raise NodeError(f"{self.name}: the collector did not finish within {COLLECT_TIMEOUT:.0f} s",
                            "try: " + self.try_command(f"{self.python} -c 'import torch'"))
        facts = result.values(protocol.FACTS)
        if not facts:
            # The program's first line is its clock sample: without it, `python` never ran it.
            raise explain_python(self.name, self.python, result.exit if result.exit is not None else -1,
                                 result.stderr or result.error or "", ran=bool(clock))
        out = facts[-1]
        out["clock"] = self._clock_offset(sent, clock)
        return out

    def _clock_offset(self, sent: float, clock: list[tuple[float, float]]) -> dict:
        """The node's clock minus ours; the round trip bounds the error."""
        if not clock:
            return {"error": "the collector sent no clock sample"}
        remote, arrived = clock[0]
        return {"offset": remote - (sent + arrived) / 2, "uncertainty": (arrived - sent) / 2}
