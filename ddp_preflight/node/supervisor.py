"""A job in its own process group, on the node: nothing of it outlives its time bound, the
master's stop, or the master itself.

spec: {"program": "supervise", "job": <a node program's spec>, "env": {...}, "timeout": seconds,
       "lease": seconds or null, "cwd": path or null}
The job runs as a child (this package from the zip, its spec on its stdin: never in argv), with
`env` on top of the node's environment, in this program's private folder. Its stdout and stderr
are the channel's. The master's line (control.py) stops it: EOF is a stop, silence longer than
the lease means the master is gone; a launch job also takes "prepare-stop" before it (asked()).
Then, and at the bound, and when the job ends by itself, the whole job is ended (SIGTERM, then
SIGKILL after a grace): its process group, and every process it started, also those in sessions
of their own (torchrun starts each rank in one): the supervisor keeps a list of them while the
job runs, so a rank left behind when torchrun itself is gone is still found. The private folder
goes with this program (boot.py). The last line is the outcome: JOB + JobOutcome."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

from . import proc, protocol, signing, trust
from .control import Control
from .loader_env import job_refusal
from .rank_bootstrap import GATE_OPEN

GRACE = 5.0      # seconds between SIGTERM and SIGKILL: torchrun stops its ranks and the launch
                 # program says their exits (at load average 5, 2 s cut that off)
LOOK_EVERY = 1.0  # seconds between two listings of the job's processes

PREPARES = {"launch"}       # the jobs that take the master's "prepare-stop" (SIGUSR2): node/launch_runner.py
CHILD = "import sys; sys.path.insert(0, sys.argv[1]); from ddp_preflight.node.programs import child; child()"


class Tree:
    """Every process the job has started, by (pid, start time): listed while it runs, so that its
    processes in other sessions (torchrun's ranks) are known even after their parent is gone."""

    def __init__(self, root: int):
        self.root = root
        self.seen: dict[int, int] = {}        # pid -> start ticks
        self.lock = threading.Lock()

    def look(self) -> None:
        parents: dict[int, list[int]] = {}
        starts: dict[int, int] = {}
        for pid in proc.pids():
            st = proc.stat(pid)
            if st is not None:
                parents.setdefault(st.ppid, []).append(pid)
                starts[pid] = st.start_ticks
        with self.lock:
            frontier = [self.root] + list(self.seen)
            while frontier:
                pid = frontier.pop()
                for child in parents.get(pid, ()):
                    if child not in self.seen and child in starts:
                        self.seen[child] = starts[child]
                        frontier.append(child)

    def alive(self) -> list[int]:
        """Those still running (a pid now held by another process is not ours)."""
        with self.lock:
            known = dict(self.seen)
        out = []
        for pid, start in known.items():
            st = proc.stat(pid)
            if st is not None and st.start_ticks == start and st.state not in "ZX":
                out.append(pid)
        return out

    def watch(self, stop: threading.Event) -> None:
        while not stop.wait(LOOK_EVERY):
            self.look()


def end_job(pgid: int, tree: Tree, grace: float = GRACE) -> None:
    """SIGTERM to the job's group (torchrun stops its ranks in order), then SIGKILL to the group
    and to every process of the job still alive after the grace."""
    tree.look()
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        tree.look()
        if not _group_alive(pgid) and not tree.alive():
            return
        time.sleep(0.05)
    _signal_group(pgid, signal.SIGKILL)
    for pid in tree.alive():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def start_child(job: dict, work, env: dict, cwd=None) -> subprocess.Popen:
    """A node program as a process of its own, in a new session (its own process group), started
    as trust.python_argv starts a Python, in `cwd` or else in this program's private folder: a
    Python it starts with -m (torchrun's ranks) puts its folder first on sys.path."""
    # A job that takes "prepare-stop" starts with SIGUSR2 blocked (the mask goes through exec), so a
    # prepare that comes before its handler is set waits for it instead of ending it.
    held = {signal.SIGUSR2} if job.get("program") in PREPARES else set()
    before = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        proc = subprocess.Popen(trust.python_argv(sys.executable, CHILD, work.zip_path), stdin=subprocess.PIPE,
                                env=env, cwd=cwd or work.folder, start_new_session=True)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
    assert proc.stdin is not None
    try:
        # The job signs its lines with this program's key (node/signing.py): on its stdin only.
        proc.stdin.write(json.dumps({**job, "work": work.folder, "key": signing.own_key()}).encode())
        proc.stdin.close()
    except OSError:
        pass       # it died at once: its exit code says so
    return proc


def asked(command: dict, job: dict, pid: int, folder: str | None = None) -> None:
    """A command on the master's line: "prepare-stop" goes to a launch job as SIGUSR2 (its ranks'
    evidence kept and the ranks frozen, before the stop itself); "open-gate" to a launch job
    whose ranks ran the probes puts the master's READY in this program's private folder, the
    launch program's too (`folder`), where the ranks wait for it (node/rank_bootstrap.py): no
    other user can write there. To any other job, nothing."""
    if command.get("cmd") == "prepare-stop" and job.get("program") in PREPARES:
        try:
            os.kill(pid, signal.SIGUSR2)
        except ProcessLookupError:
            pass
    if command.get("cmd") == "open-gate" and job.get("program") in PREPARES and job.get("probes") and folder:
        try:
            os.close(os.open(os.path.join(folder, GATE_OPEN), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                             0o600))
        except FileExistsError:
            pass       # said twice


def refused(job: dict, env: dict, cwd: str) -> bool:
    """Says so, and True, when the job's ranks would import or load from a path another user can
    change (loader_env.job_refusal: PYTHONPATH, LD_PRELOAD, ...; every job, since a loader
    variable reaches a Python started with -I too; a launch's code folder and script): before
    anything of the job starts. A launch
    says it as its own error (node/launch_runner.py's marker); any job ends with REFUSED."""
    found = job_refusal(job, env, cwd)
    if found is None:
        return False
    why, fix = found
    if job.get("program") == "launch":
        protocol.emit(protocol.LAUNCH, {"kind": "error", "message": why, "fix": fix})
    sys.stderr.write(f"ddp-preflight node: {why}; fix: {fix}\n")
    sys.stderr.flush()
    protocol.emit(protocol.JOB, protocol.JobOutcome(exit=trust.REFUSED, seconds=0.0).to_json())
    return True


def main(spec: dict, work) -> int:
    started = time.monotonic()
    env = {**os.environ, **{str(k): str(v) for k, v in (spec.get("env") or {}).items()}}
    if refused(spec["job"], env, spec.get("cwd") or work.folder):
        return 0
    try:
        job = start_child(spec["job"], work, env, spec.get("cwd"))
    except OSError as exc:
        protocol.emit(protocol.JOB, protocol.JobOutcome(exit=127, seconds=0.0).to_json())
        sys.stderr.write(f"ddp-preflight node: cannot start the job: {exc}\n")
        return 0
    tree = Tree(job.pid)
    looking = threading.Event()
    threading.Thread(target=tree.watch, args=(looking,), name="tree", daemon=True).start()
    control = Control(spec.get("lease"), on_gone=lambda why: end_job(job.pid, tree),
                      on_command=lambda command: asked(command, spec["job"], job.pid, work.folder)).start()
    timed_out = False
    try:
        job.wait(timeout=float(spec.get("timeout") or 60))
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        end_job(job.pid, tree)    # the job's own processes too, even after a clean exit
        looking.set()
    code = job.wait()
    stopped = {"eof": "asked", "silent": "master-silent"}.get(control.why or "")
    outcome = protocol.JobOutcome(exit=code if code >= 0 else None, signal=-code if code < 0 else None,
                                  timed_out=timed_out, stopped=stopped,
                                  seconds=round(time.monotonic() - started, 3))
    sys.stdout.flush()
    sys.stdout.write("\n")
    protocol.emit(protocol.JOB, outcome.to_json())
    return 0
