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
import re
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, tzinfo

from node import relay

from .errors import NodeError
from .lines import LineSplitter
from .node import Node, Process
from .payload import boot_argv, stdin_payload

HELLO_TIMEOUT = 60.0       # seconds for every relay to say hello once srun has started
IN_CHUNK = 48 * 1024       # raw bytes per frame to a relay (its lines have no length limit)


class SlurmError(Exception):
    """The job cannot be used at all (one line, with the fix)."""


@dataclass(frozen=True)
class SlurmNodeInfo:
    name: str
    address: str            # NodeAddr: what the other nodes dial
    state: str              # e.g. MIXED, IDLE+DRAIN, DOWN+NOT_RESPONDING
    reason: str = ""        # the admin's or Slurm's reason for a down or drained node

    @property
    def unusable(self) -> str | None:
        """Why nothing can run there, in Slurm's words, or None."""
        flags = set(self.state.split("+"))
        if "DRAIN" in flags or "DRAINING" in flags or "DRAINED" in flags:
            return "drained"
        if flags & {"DOWN", "FAIL", "NOT_RESPONDING", "POWERED_DOWN", "POWERING_DOWN"}:
            return "down"
        return None


@dataclass(frozen=True)
class SlurmShare:
    """What the job holds on one node, as `scontrol show job -d` lists it."""
    cpus: int               # CPUs of the job there (its CPU_IDs)
    gpus: int               # gres/gpu of the job there (GRES=gpu:2(IDX:0-1)); 0: none
    gres: str = ""          # as Slurm printed it, e.g. gpu:2(IDX:0-1)


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    state: str
    nodes: tuple[str, ...]
    info: dict[str, SlurmNodeInfo] = field(default_factory=dict)
    time_limit: str = ""    # as Slurm prints it: 00:30:00, 1-00:00:00, UNLIMITED
    end_time: str = ""      # as Slurm prints it (local time), or Unknown
    shares: dict[str, SlurmShare] = field(default_factory=dict)    # node -> what the job holds there
    num_tasks: int = 0          # NumTasks
    tasks_per_node: int = 0     # --ntasks-per-node; 0: not given
    cpus_per_task: int = 1      # CPUs/Task
    tres_per_node: str = ""     # what was asked per node, e.g. gres:gpu:2 (--gpus-per-node, --gres)
    ends_at: float | None = None    # EndTime in epoch seconds; None: no time limit
    read_at: float = 0.0            # epoch seconds when scontrol was read

    @property
    def seconds_left(self) -> float | None:
        """The job's time left when it was read; None: no time limit."""
        return None if self.ends_at is None else self.ends_at - self.read_at


def _scontrol(*args: str, timeout: float = 30) -> str:
    try:
        done = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise SlurmError("scontrol is not installed here: Slurm's client commands are needed "
                         "(run this on a node of the cluster, or apt-get install slurm-client)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"scontrol {' '.join(args)} did not answer within {timeout:.0f} s: "
                         "is slurmctld reachable (scontrol ping)?") from None
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise SlurmError(f"scontrol {' '.join(args)}: {said}")
    return done.stdout


def _fields(line: str) -> dict[str, str]:
    """`Key=value Key=value` as scontrol -o prints one record; a value runs to the next key."""
    out: dict[str, str] = {}
    for match in re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=(.*?)(?=\s+[A-Za-z][A-Za-z0-9_/:]*=|$)",
                             line.strip()):
        out.setdefault(match.group(1), match.group(2).strip())
    return out


def read_job(job_id: str) -> SlurmJob:
    """The job's nodes, each node's state and what the job holds there, and its time left, from
    Slurm (raises SlurmError)."""
    if not re.fullmatch(r"\d+(_\d+)?", job_id):
        raise SlurmError(f"--slurm-job {job_id!r}: a job id is a number (squeue --me lists yours)")
    read_at = time.time()
    job_line = _scontrol("show", "job", "-d", "-o", job_id).strip().splitlines()[0]
    record = _fields(job_line)
    state = record.get("JobState", "")
    if state != "RUNNING":
        raise SlurmError(f"Slurm job {job_id} is {state or 'unknown'}, not RUNNING: give a running job "
                         "(squeue --me shows ST R), or run inside an allocation (salloc -N N, or an sbatch script)")

    def expand(hostlist: str) -> list[str]:
        return _scontrol("show", "hostnames", hostlist).split() if "[" in hostlist else hostlist.split(",")

    names = tuple(expand(record.get("NodeList", "")))
    info = {}
    for line in _scontrol("show", "node", "-o", ",".join(names)).strip().splitlines():
        node = _fields(line)
        reason = re.sub(r"\s*\[[^\]]*\]$", "", node.get("Reason", ""))
        info[node.get("NodeName", "")] = SlurmNodeInfo(node.get("NodeName", ""), node.get("NodeAddr", ""),
                                                       node.get("State", ""), reason)
    return parse_job(job_line, names, info, expand, read_at)


def _count(text: str) -> int:
    """`0-1,4` -> 3: a CPU_IDs or IDX list."""
    total = 0
    for part in text.split(","):
        low, _, high = part.partition("-")
        if low.isdigit():
            total += int(high) - int(low) + 1 if high.isdigit() else 1
    return total


def _gpus(gres: str) -> int:
    """gres/gpu in a node's GRES as `-d` prints it: gpu:2(IDX:0-1), gpu:a100:1(IDX:0),mps:..."""
    return sum(int(m.group(1)) for m in re.finditer(r"(?:^|,)gpu(?::[^:(,]+)?:(\d+)", gres))


def _int(text: str, default: int) -> int:
    return int(text) if text.isdigit() else default


def parse_job(line: str, nodes: tuple[str, ...], info: dict[str, SlurmNodeInfo],
              expand: Callable[[str], list[str]], read_at: float, tz: tzinfo | None = None) -> SlurmJob:
    """The job as `scontrol show job -d -o ID` prints it (one line), read at `read_at`. `expand`
    turns a hostlist (node[01-02]) into names; `tz`: the zone scontrol printed times in (its
    local time when None)."""
    record = _fields(line)
    shares = {}
    # -d adds one `Nodes=LIST CPU_IDs=... Mem=... GRES=...` group per set of nodes alike.
    for m in re.finditer(r"(?:^|\s)Nodes=(\S+) CPU_IDs=(\S*) Mem=\S* GRES=(\S*)", line):
        for name in expand(m.group(1)):
            shares[name] = SlurmShare(_count(m.group(2)), _gpus(m.group(3)), m.group(3))
    end = record.get("EndTime", "")
    try:
        ends_at: float | None = datetime.strptime(end, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=tz).timestamp()
    except ValueError:
        ends_at = None          # Unknown: no time limit
    if record.get("TimeLimit", "") == "UNLIMITED":
        ends_at = None
    return SlurmJob(record.get("JobId", ""), record.get("JobState", ""), nodes, info,
                    time_limit=record.get("TimeLimit", ""), end_time=end, shares=shares,
                    num_tasks=_int(record.get("NumTasks", ""), 0),
                    tasks_per_node=_int(record.get("NtasksPerN:B:S:C", "").split(":")[0], 0),
                    cpus_per_task=_int(record.get("CPUs/Task", ""), 1),
                    tres_per_node=record.get("TresPerNode", ""), ends_at=ends_at, read_at=read_at)


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
        self._users = 0

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
            assert self.proc.stdin is not None
            self.proc.stdin.write(stdin_payload({"program": "relay"}))     # every task reads it
            self.proc.stdin.flush()
            threading.Thread(target=self._read, name="srun-stdout", daemon=True).start()
            threading.Thread(target=self._read_stderr, name="srun-stderr", daemon=True).start()

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
        splitter = LineSplitter(max_line=relay.MAX_FRAME * 2)
        stream = self.proc.stdout
        for chunk in iter(lambda: stream.read1(65536), b""):     # type: ignore[attr-defined]
            for line in splitter.feed(chunk):
                self._frame(line)
        self._end()

    def _frame(self, line: str) -> None:
        found = relay.parse(line)
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
        for raw in self.proc.stderr:
            self._stderr.append(raw.decode(errors="replace").rstrip())

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
