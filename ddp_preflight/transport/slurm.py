"""Nodes of a Slurm job, reached through ONE `srun --overlap` step for all of them: a relay per
node (node/relay.py) carries that node's programs over the step's per-task stdio, as one ssh
connection carries an SshNode's channels. Slurm does the fan-out; nothing here needs ssh.

    step = SlurmStep(job, python)          # `scontrol show job`: its nodes, each node's state
    nodes = [SlurmNode(name, python, step) for name in job.nodes]

A node that Slurm marks down or drained is left out of the step and is that node's one-line
error; the others still report. Closing the last node ends the step: the relays stop what they
started, and srun, then Slurm, end the step."""

from __future__ import annotations

import collections
import json
import os
import queue
import subprocess
import threading
import time

from ddp_preflight.node import relay, signing

from .errors import NodeError
from .lines import LineSplitter
from .node import Node, Process
from .payload import boot_argv, stdin_payload

# The job as Slurm sees it, and whether this user may use it (transport/slurm_job.py).
from .slurm_job import SlurmError, SlurmJob, SlurmNodeInfo, SlurmShare, parse_job, read_job
from .slurm_job import _fields as _fields  # noqa: F401  (read by the parsing tests)

__all__ = ["SlurmError", "SlurmJob", "SlurmNode", "SlurmNodeInfo", "SlurmShare", "SlurmStep", "parse_job", "read_job"]

HELLO_TIMEOUT = 60.0       # seconds for every relay to say hello once srun has started
IN_CHUNK = 48 * 1024       # raw bytes per frame to a relay (its lines have no length limit)


class _Channel(Process):
    """One node program behind a relay: its stdout and stderr arrive as frames."""

    def __init__(self, step: SlurmStep, task: str, number: int):
        self.step, self.task, self.number = step, task, number
        self.output: queue.Queue[bytes | None] = queue.Queue()     # None: the step ended
        self._stderr: collections.deque[bytes] = collections.deque(maxlen=64)
        self._stderr_done = threading.Event()
        self._exit: int | None = None
        self._ended = threading.Event()
        self._closed = False

    # frames from the relay
    def arrived(self, op: str, data: bytes) -> None:
        if op == "out":
            self.output.put(data)                  # b"": the end of its stdout
        elif op == "err":
            if data:
                self._stderr.append(data)
            else:
                self._stderr_done.set()
        elif op == "exit":
            try:
                self._exit = int(data.decode())
            except ValueError:
                self._exit = None
            self._ended.set()

    def lost(self) -> None:
        """The step ended under it: no more frames will come."""
        self.output.put(None)
        self._stderr_done.set()
        self._ended.set()

    # Process
    def write(self, data: bytes) -> bool:
        if self._closed:
            return False
        for start in range(0, max(len(data), 1), IN_CHUNK):
            if not self.step.send(self.task, self.number, "in", data[start:start + IN_CHUNK]):
                return False
        return True

    def heartbeat(self) -> None:
        if not self._closed:
            self.step.send(self.task, self.number, "in", b"\n")

    def close_input(self) -> None:
        if not self._closed:
            self._closed = True
            self.step.send(self.task, self.number, "eof")

    def read(self) -> bytes:
        data = self.output.get()
        if data is None:
            self.output.put(None)
            raise ConnectionError(self.step.why_ended())
        return data

    def wait(self, timeout: float | None = None) -> int | None:
        if not self._ended.wait(timeout):
            return None
        return self._exit

    def stderr_text(self) -> str:
        self._stderr_done.wait(5)
        return b"".join(self._stderr).decode(errors="replace")[-8192:]

    def kill(self) -> None:
        self.step.send(self.task, self.number, "kill")


class SlurmStep:
    """One `srun --overlap --jobid ID --nodes N --ntasks-per-node 1` step running a relay on
    every usable node of the job; started at the first connect, ended by the last close."""

    def __init__(self, job: SlurmJob, python: str):
        self.job, self.python = job, python
        self.usable = [n for n in job.nodes if job.info.get(n) is None or job.info[n].unusable is None]
        self.proc: subprocess.Popen | None = None
        self.tasks: dict[str, str] = {}             # Slurm node name -> task id
        self.hello = threading.Condition()
        self.channels: dict[tuple[str, int], _Channel] = {}
        self._numbers = iter(range(1, 1 << 62))
        self._lock = threading.Lock()               # srun's stdin, and the channel table
        self._start_lock = threading.Lock()
        self._stderr: collections.deque[str] = collections.deque(maxlen=200)
        self._ended = threading.Event()
        self._stderr_read = threading.Event()       # srun's stderr is read to its end
        self._users = 0
        self._key = signing.new_key()                 # the relays sign their frames with it
        self._verifier = signing.Verifier(self._key)

    def argv(self) -> list[str]:
        n = str(len(self.usable))
        return ["srun", "--overlap", "--jobid", self.job.job_id, "--nodes", n, "--ntasks", n,
                "--ntasks-per-node", "1", "--nodelist", ",".join(self.usable), "--kill-on-bad-exit=0",
                "--job-name", "ddp-preflight", *boot_argv(self.python)]

    def start(self) -> None:
        with self._start_lock:
            self._users += 1
            if self.proc is not None or not self.usable:
                return
            env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, env=env, start_new_session=True)
            # Readers first: when Slurm refuses the step, srun's words and its end are read at
            # once, and each node's connect says them instead of waiting HELLO_TIMEOUT.
            threading.Thread(target=self._read, name="srun-stdout", daemon=True).start()
            threading.Thread(target=self._read_stderr, name="srun-stderr", daemon=True).start()
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write(stdin_payload({"program": "relay", "key": self._key}))   # every task reads it
                self.proc.stdin.flush()
            except OSError:
                pass            # a broken pipe: srun has ended already; _read sees it, task_of says why

    def task_of(self, name: str, timeout: float = HELLO_TIMEOUT) -> str:
        """The task that runs on this node, once its relay said hello (raises NodeError)."""
        info = self.job.info.get(name)
        if info is not None and info.unusable:
            reason = f" (reason: {info.reason})" if info.reason and info.reason != "(null)" else ""
            if info.unusable == "drained":
                raise NodeError(f"{name}: Slurm has drained this node{reason}; nothing was run there",
                                f"scontrol update nodename={name} state=resume   # once the cause is fixed")
            raise NodeError(f"{name}: Slurm marks this node down ({info.state}){reason}; nothing was run there",
                            f"start slurmd on {name}, then: scontrol update nodename={name} state=resume")
        if name not in self.job.nodes:
            raise NodeError(f"{name}: not a node of Slurm job {self.job.job_id} "
                            f"(its nodes: {','.join(self.job.nodes)})",
                            f"leave {name} out, or run inside an allocation that includes it")
        deadline = time.monotonic() + timeout
        with self.hello:
            while name not in self.tasks and not self._ended.is_set() and time.monotonic() < deadline:
                self.hello.wait(0.5)
            if name in self.tasks:
                return self.tasks[name]
        if self._ended.is_set():
            self._stderr_read.wait(2)       # srun's last words, read to their end
        said = [line for line in self._stderr if name in line] or list(self._stderr)
        last = said[-1].strip() if said else ""
        if self._ended.is_set():
            raise NodeError(f"{name}: the srun step ended before this node's task started"
                            + (f": {last}" if last else ""),
                            f"srun --overlap --jobid {self.job.job_id} -w {name} -N1 true   # to see why")
        raise NodeError(f"{name}: this node's task of the srun step did not start within {timeout:.0f} s"
                        + (f": {last}" if last else ""),
                        f"srun --overlap --jobid {self.job.job_id} -w {name} -N1 true   # to see why")

    def open(self, name: str, argv: list[str], boot: dict | None) -> _Channel:
        task = self.task_of(name)
        with self._lock:
            number = next(self._numbers)
            channel = _Channel(self, task, number)
            self.channels[(task, number)] = channel
            if self._ended.is_set():
                channel.lost()
                return channel
        self.send(task, number, "open", json.dumps({"argv": argv, "boot": boot}).encode())
        return channel

    def send(self, task: str, number: int, op: str, data: bytes = b"") -> bool:
        with self._lock:
            if self.proc is None or self.proc.stdin is None or self._ended.is_set():
                return False
            try:
                self.proc.stdin.write(relay.frame(task, number, op, data))
                self.proc.stdin.flush()
                return True
            except (OSError, ValueError):
                return False

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        # A relay writes frames of MAX_FRAME bytes and no marked line: a longer one is a rank's.
        splitter = LineSplitter(max_line=relay.MAX_FRAME * 2, max_marked=relay.MAX_FRAME * 2)
        stream = self.proc.stdout
        for chunk in iter(lambda: stream.read1(65536), b""):     # type: ignore[attr-defined]
            for line in splitter.feed(chunk):
                self._frame(line)
        self._end()

    def _frame(self, line: str) -> None:
        signed = self._verifier.check(line)      # a relay's frame, not a rank's (it can write to its relay's stdout)
        found = relay.parse(signed) if signed is not None else None
        if found is None:
            return
        task, number, op, data = found
        if op == "hello":
            me = json.loads(data.decode())
            with self.hello:
                self.tasks[me.get("node", "")] = task
                self.hello.notify_all()
            return
        with self._lock:
            channel = self.channels.get((task, number))
            if op == "exit":
                self.channels.pop((task, number), None)
        if channel is not None:
            channel.arrived(op, data)

    def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        try:
            for raw in self.proc.stderr:
                self._stderr.append(raw.decode(errors="replace").rstrip())
        finally:
            self._stderr_read.set()

    def _end(self) -> None:
        with self._lock:
            self._ended.set()
            channels = list(self.channels.values())
            self.channels.clear()
        for channel in channels:
            channel.lost()
        with self.hello:
            self.hello.notify_all()

    def close(self) -> None:
        """One node is done with the step; the last one ends it."""
        with self._start_lock:
            self._users -= 1
            if self._users > 0 or self.proc is None:
                return
            proc = self.proc
        with self._lock:
            try:
                assert proc.stdin is not None
                proc.stdin.close()          # every relay reads EOF: it stops its programs
            except OSError:
                pass
        try:
            proc.wait(relay.GRACE + 10)
        except subprocess.TimeoutExpired:
            proc.terminate()                # srun then ends the step's tasks itself
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._ended.wait(5)

    def why_ended(self) -> str:
        """Why the step ended under running programs, in Slurm's words when it said any."""
        if self.proc is not None:
            try:
                self.proc.wait(2)
            except subprocess.TimeoutExpired:
                pass
        said = [line for line in self._stderr if "CANCELLED" in line or "error" in line]
        code = self.proc.returncode if self.proc is not None else None
        return (f"the srun step ended (exit code {code})" if code is not None else "the srun step ended") + \
            (f": {said[-1].strip()}" if said else "")


class SlurmNode(Node):
    """A node of a Slurm job; its programs run under the job's one srun step (SlurmStep)."""

    def __init__(self, name: str, python: str, step: SlurmStep):
        super().__init__(name, python)
        self.step = step
        self._started = False

    @property
    def address(self) -> str:
        info = self.step.job.info.get(self.name)
        return info.address if info is not None and info.address else self.name

    def connect(self) -> None:
        if not self._started:
            self._started = True
            self.step.start()
        self.step.task_of(self.name)

    def close(self) -> None:
        if self._started:
            self._started = False
            self.step.close()

    def _spawn(self, argv: list[str]) -> Process:
        return self.step.open(self.name, argv, None)

    def _boot(self, spec: dict, data: bytes) -> Process:
        # The relay holds the package already: only the spec (and data) cross srun's stdin.
        channel = self.step.open(self.name, boot_argv(self.python), spec)
        if data:
            channel.write(data)
        return channel

    def try_command(self, command: str) -> str:
        return f"srun --overlap --jobid {self.step.job.job_id} -w {self.name} -N1 {command}"
