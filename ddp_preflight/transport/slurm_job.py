"""A Slurm job as Slurm sees it (`scontrol show job -d`): its nodes, each node's state, what the
job holds there and its time left; and whether this user may use it at all. A job that cannot be
used (unknown to Slurm, ended, another user's) is one SlurmError line with Slurm's reason and the
fix, said within the few seconds scontrol takes, before any srun step is tried."""

from __future__ import annotations

import os
import pwd
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, tzinfo

from . import slurm_hostlist
from .host_names import HostListError, bad_host_reason, check_hosts

SCONTROL_TIMEOUT = 30.0     # seconds; scontrol answers in milliseconds when slurmctld is up
HOSTNAMES_TIMEOUT = 10.0    # seconds; `show hostnames` reads only the configuration, never slurmctld


class SlurmError(Exception):
    """The job cannot be used at all (one line, with the fix)."""


class NotRunning(SlurmError):
    """The job is not running (yet, or any more): its state as squeue says it, and why it waits."""

    def __init__(self, message: str, state: str, reason: str):
        super().__init__(message)
        self.state, self.reason = state, reason


# The states of a job that will run: waited for (--slurm-job), never refused. A held job
# (PENDING, reason JobHeldUser) waits too: its owner may release it.
WILL_RUN = ("PENDING", "CONFIGURING", "REQUEUED")
POLL = 2.0                # seconds between two looks at a job that is not running yet


@dataclass(frozen=True)
class SlurmNodeInfo:
    name: str
    address: str            # NodeAddr: what the other nodes dial
    state: str              # e.g. MIXED, IDLE+DRAIN, DOWN+NOT_RESPONDING
    reason: str = ""        # the admin's or Slurm's reason for a down or drained node

    @property
    def draining(self) -> bool:
        """Slurm drains it while jobs still run there (ALLOCATED+DRAIN, MIXED+DRAIN: sinfo's
        `drng`): the job's steps still run on it; no new job will be placed there."""
        flags = set(self.state.split("+"))
        return bool(flags & {"DRAIN", "DRAINING"}) and bool(flags & {"ALLOCATED", "MIXED", "COMPLETING"})

    @property
    def unusable(self) -> str | None:
        """Why nothing can run there, in Slurm's words, or None. A node being drained with the
        job on it is usable (srun runs there): `draining`."""
        flags = set(self.state.split("+"))
        if ("DRAIN" in flags or "DRAINING" in flags or "DRAINED" in flags) and not self.draining:
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


def _scontrol(*args: str, timeout: float = SCONTROL_TIMEOUT) -> str:
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


def hostnames(hostlist: str) -> list[str]:
    """The names in a Slurm host list, the one expansion for --slurm's SLURM_JOB_NODELIST and
    --slurm-job's NodeList: Slurm's own (`scontrol show hostnames`) where its client answers, else
    the same rules without it (slurm_hostlist.expand, tested against what Slurm printed). A list
    is counted first: a malformed one, or one over MAX_HOSTS, is a HostListError before Slurm is
    asked to print it; every name passes the host check."""
    slurm_hostlist.checked(hostlist)
    if "[" not in hostlist:
        return slurm_hostlist.expand(hostlist)     # nothing to expand: its items are its names
    try:
        names = _scontrol("show", "hostnames", hostlist, timeout=HOSTNAMES_TIMEOUT).split()
    except SlurmError:
        names = []         # no Slurm client here, or no configuration for it to read
    if not names:
        return slurm_hostlist.expand(hostlist)
    for name in names:
        reason = bad_host_reason(name)
        if reason:
            raise HostListError(reason)
    return names


def _fields(line: str) -> dict[str, str]:
    """`Key=value Key=value` as scontrol -o prints one record; a value runs to the next key."""
    out: dict[str, str] = {}
    for match in re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=(.*?)(?=\s+[A-Za-z][A-Za-z0-9_/:]*=|$)",
                             line.strip()):
        out.setdefault(match.group(1), match.group(2).strip())
    return out


def read_job(job_id: str) -> SlurmJob:
    """The job's nodes, each node's state and what the job holds there, and its time left, from
    Slurm (raises SlurmError: one line with Slurm's reason and the fix)."""
    if not re.fullmatch(r"\d+(_\d+)?", job_id):
        raise SlurmError(f"--slurm-job {job_id!r}: a job id is a number (squeue --me lists yours)")
    read_at = time.time()
    try:
        shown = _scontrol("show", "job", "-d", "-o", job_id).strip().splitlines()
    except SlurmError as exc:
        raise SlurmError(f"--slurm-job {job_id}: {exc}; give one of your running jobs (squeue --me lists them), "
                         "or run inside an allocation (salloc -N N, or an sbatch script)") from None
    job_line = shown[0] if shown else ""
    record = _fields(job_line)
    # Whose it is, its state and its nodes decide whether it may be used: read from squeue's
    # fixed fields, never from scontrol's `Key=value` line, where a job name such as
    # 'x UserId=root(0) JobState=RUNNING' reads as the fields it names.
    owner = _owner(job_id)
    state = owner.state if owner else (record.get("JobState", "") if record.get("JobState") != "RUNNING" else "")
    if owner is None or state != "RUNNING":
        raise NotRunning(f"Slurm job {job_id} is {state or 'unknown'}, not RUNNING: give a running job "
                         "(squeue --me shows ST R), or run inside an allocation (salloc -N N, or an sbatch script)",
                         state, owner.reason if owner else "")
    refused = not_yours(job_id, f"{owner.user}({owner.uid})")
    if refused:
        raise SlurmError(refused)
    record["NodeList"] = owner.nodes

    def expand(hostlist: str) -> list[str]:
        try:
            return hostnames(hostlist)
        except HostListError as exc:
            raise SlurmError(f"Slurm job {job_id}'s NodeList: {exc}") from None     # as check_hosts says it

    names = tuple(expand(record.get("NodeList", "")))
    try:
        check_hosts(f"Slurm job {job_id}'s NodeList", names)
    except HostListError as exc:
        raise SlurmError(str(exc)) from None
    info = {}
    for line in _scontrol("show", "node", "-o", ",".join(names)).strip().splitlines():
        node = _fields(line)
        reason = re.sub(r"\s*\[[^\]]*\]$", "", node.get("Reason", ""))
        info[node.get("NodeName", "")] = SlurmNodeInfo(node.get("NodeName", ""), node.get("NodeAddr", ""),
                                                       node.get("State", ""), reason)
    return parse_job(job_line, names, info, expand, read_at)


@dataclass(frozen=True)
class _Owner:
    uid: int
    user: str
    state: str
    nodes: str
    reason: str = ""       # why it waits (squeue's %r: Resources, Priority, JobHeldUser...)


# uid, user name, state, node list: none a job's owner can word; then why it waits, last (it may
# hold a space), shown only as printable words.
SQUEUE_FORMAT = "%U %u %T %N %r"


def _owner(job_id: str) -> _Owner | None:
    """The job's uid, user, state and nodes as squeue prints them (fields whose values are
    numbers, account names, Slurm's state words and host lists: nothing the job's owner chose can
    add a field); None when squeue does not list the job."""
    try:
        done = subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", SQUEUE_FORMAT],
                              capture_output=True, text=True, timeout=SCONTROL_TIMEOUT)
    except FileNotFoundError:
        raise SlurmError("squeue is not installed here: Slurm's client commands are needed "
                         "(run this on a node of the cluster, or apt-get install slurm-client)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"squeue -j {job_id} did not answer within {SCONTROL_TIMEOUT:.0f} s: "
                         "is slurmctld reachable (scontrol ping)?") from None
    lines = done.stdout.splitlines() if done.returncode == 0 else []
    words = lines[0].split(" ", 4) if len(lines) == 1 else []
    if len(words) != 5 or not words[0].isdigit() or not re.fullmatch(r"[A-Z_]+", words[2]):
        return None
    reason = re.sub(r"[^\w ,:()\[\]./=-]", "?", words[4].strip())[:120]
    return _Owner(int(words[0]), words[1], words[2], words[3], "" if reason in ("None", "(null)") else reason)


def wait_until_running(job_id: str, say: Callable[[str], None], poll: float = POLL,
                       sleep: Callable[[float], None] = time.sleep) -> SlurmJob:
    """The job, once it runs: one that will (pending, its nodes booting, requeued) is waited for,
    said once and again whenever its state or reason changes; one that ended, or is not the
    user's, raises SlurmError at once."""
    said = None
    while True:
        try:
            return read_job(job_id)
        except NotRunning as exc:
            if exc.state not in WILL_RUN:
                raise
            if (exc.state, exc.reason) != said:
                said = (exc.state, exc.reason)
                say(f"Slurm job {job_id} is {exc.state}" + (f" ({exc.reason})" if exc.reason else "") +
                    ": waiting for it to start (Ctrl-C stops)")
        sleep(poll)


def not_yours(job_id: str, user_id: str) -> str | None:
    """Why this user cannot run a step in the job (`UserId=name(uid)` as scontrol prints it), or
    None. slurmctld creates a step only for the job's own user, whoever asks: root too is told
    `srun: error: Unable to create step for job N: Access/permission denied` (tried on Slurm
    22.05), so this is said before srun is started, rather than after a broken pipe."""
    match = re.fullmatch(r"(.*)\((\d+)\)", user_id)
    if match is None or int(match.group(2)) == os.getuid():
        return None
    owner, uid = match.group(1), int(match.group(2))
    try:
        me = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        me = f"uid {os.getuid()}"
    return (f"Slurm job {job_id} belongs to {owner} (uid {uid}), not to {me}: Slurm runs a step in a job only "
            f"for its own user, root too (srun: Unable to create step for job {job_id}: Access/permission denied); "
            f"give one of your own running jobs (squeue --me), or run this as {owner}")


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
