"""Each watch follows only its own ranks (issue 34 part B): a launch the processes it started (its
run token, node/ranks.py), `hangwatch attach --pid A --pid B` exactly those processes and the
ranks of those that are launchers. Real processes: other runs of this same user (root), and of a
second local user, beside them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp_preflight.node.ranks import RUN_VARIABLE, Finder
from tests.hostile import hostile_user

from .ports import free_port

ROOT = Path(__file__).parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"
SLEEP = "import time; time.sleep(120)"
# A torchrun by its command line (node/ranks.py's is_launcher) that starts one rank below it.
LAUNCHER = ("import os, subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
            " env={**os.environ, 'RANK': '0', 'WORLD_SIZE': '2', 'LOCAL_RANK': '0'})\n"
            "time.sleep(120)\n")


def rank_env(port: int, token: str | None = None) -> dict:
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port)}
    env.pop(RUN_VARIABLE, None)
    return {**env, RUN_VARIABLE: token} if token else env


class Processes:
    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def start(self, argv: list[str], env: dict, user=None) -> int:
        if user is not None:       # the second user cannot run this checkout's venv (root's pyenv)
            argv = [SYSTEM_PYTHON if word == sys.executable else word for word in argv]
            env = {**user.env(), **{k: v for k, v in env.items() if k not in ("HOME", "PATH", "USER", "LOGNAME")}}
        popen = user.popen(argv, env=env) if user is not None else subprocess.Popen(argv, env=env)
        self.started.append(popen)
        return popen.pid

    def children(self, pid: int, timeout: float = 10) -> set[int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = {int(p) for p in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                                                     text=True).stdout.split()}
            if found:
                return found
            time.sleep(0.05)
        raise AssertionError(f"pid {pid} started nothing")

    def stop(self) -> None:
        for popen in self.started:
            for child in subprocess.run(["pgrep", "-P", str(popen.pid)], capture_output=True,
                                        text=True).stdout.split():
                try:
                    os.kill(int(child), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            popen.kill()
            popen.wait(10)


@pytest.fixture
def processes():
    started = Processes()
    yield started
    started.stop()


def test_a_launchs_agent_finds_its_own_run_alone_by_its_token(processes):
    ours, theirs = "a" * 16, "b" * 16
    port, other_port = free_port(), free_port()
    mine = processes.start([sys.executable, "-c", SLEEP], rank_env(port, ours))
    mine_launcher = processes.start([sys.executable, "-c", SLEEP, "torchrun", "--nnodes", "1"], rank_env(port, ours))
    # This user's other runs: no token, another token, a torchrun of --nnodes 3 waiting in its rendezvous.
    other = processes.start([sys.executable, "-c", SLEEP], rank_env(other_port))
    other_token = processes.start([sys.executable, "-c", SLEEP], rank_env(other_port, theirs))
    waiting = processes.start([sys.executable, "-c", SLEEP, "torchrun", "--nnodes", "3"], rank_env(other_port))
    # A second user who copied the token: its process is no process of this launch.
    forged = processes.start([sys.executable, "-c", SLEEP], rank_env(port, ours), user=hostile_user())
    time.sleep(0.5)
    everyone = {mine, mine_launcher, other, other_token, waiting, forged}
    finder = Finder(run=ours)
    found = finder.scan()
    assert set(found) & everyone == {mine}
    assert set(finder.launchers) & everyone == {mine_launcher}
    # Without a token (attach, nothing given): every one of them, as before.
    unrestricted = Finder()
    assert set(unrestricted.scan()) & everyone == {mine, other, other_token, forged}
    assert set(unrestricted.launchers) & everyone == {mine_launcher, waiting}


def test_attach_with_pids_finds_exactly_those_and_a_given_launchers_ranks(processes, tmp_path):
    port = free_port()
    given_rank = processes.start([sys.executable, "-c", SLEEP], rank_env(port))
    launcher = processes.start([sys.executable, "-c", LAUNCHER, "torchrun", "--nnodes", "1"], rank_env(port))
    [launched] = processes.children(launcher)
    # Root's other ranks, and a second user's: not given, never found.
    root_other = processes.start([sys.executable, "-c", SLEEP], rank_env(free_port()))
    stranger = processes.start([sys.executable, "-c", SLEEP], rank_env(port), user=hostile_user())
    time.sleep(0.5)
    finder = Finder(given=[given_rank, launcher])
    found = finder.scan()
    everyone = {given_rank, launcher, launched, root_other, stranger}
    assert set(found) & everyone == {given_rank, launched}
    assert found[launched]["given"] and found[given_rank]["given"]
    assert set(finder.launchers) & everyone == {launcher}


def test_attach_to_a_pid_that_does_not_exist_is_one_line_and_exit_2():
    done = subprocess.run([sys.executable, "-m", "ddp_preflight.hangwatch", "attach", "--pid", "999999"], capture_output=True,
                          text=True, cwd=ROOT, timeout=60)
    host = os.uname().nodename
    assert (done.returncode, done.stdout, done.stderr) == (
        2, "", f"hangwatch: error: --pid 999999: no such process on {host}; give the pid of a running rank or "
               "torchrun (ps -ef)\n")


HEALTHY = """import os, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4)
for step in range(%d):
    dist.all_reduce(t)
    print(f"step {step}", flush=True)
    time.sleep(0.5)
dist.destroy_process_group()
"""


def test_a_healthy_launch_is_not_stopped_for_another_run_of_its_user_and_reports_none_of_it(processes, tmp_path):
    """A real `--launch --stop-on-hang` of a healthy run, 20 s, while this same user runs a torchrun
    of --nnodes 3 on another port that waits in its rendezvous (read as a hang before: the launch
    was stopped) and a 1-node run whose rank sleeps: the launch finishes, no incident is written,
    the other runs are not stopped, and no file of the launch names one of their processes."""
    script = tmp_path / "train.py"
    script.write_text(HEALTHY % 40)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop(RUN_VARIABLE, None)
    waiting = processes.start([sys.executable, "-m", "torch.distributed.run", "--nnodes", "3", "--node-rank", "0",
                               "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port",
                               str(free_port()), str(script)], env)
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\ntime.sleep(300)\n")
    other = processes.start([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "1",
                             "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(sleeper)], env)
    other_rank = processes.children(other, timeout=60)
    log_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "ddp_preflight", "--no-probes", "--force", "--master-port", str(free_port()),
                           "--nproc-per-node", "2", "--launch", "--stop-on-hang", "--log-dir", str(log_dir), "--",
                           str(script)], capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "training finished" in done.stderr, done.stderr[-3000:]
    assert "hangwatch named a hang" not in done.stderr and "stopped" not in done.stderr.lower(), done.stderr[-3000:]
    assert not (log_dir / "incidents").exists() or not any((log_dir / "incidents").iterdir())
    # The other runs go on, untouched.
    assert processes.started[0].poll() is None and processes.started[1].poll() is None
    theirs = {waiting, other, *other_rank}
    result = json.loads((log_dir / "result.json").read_text())
    assert result["ok"] is True, result
    for path in (p for p in log_dir.rglob("*") if p.is_file()):
        text = path.read_text()
        for pid in theirs:
            assert f"pid {pid}" not in text and f'"pid": {pid}' not in text, (path, pid)


FORGED = """import time
def forged_all_reduce_under_roots_rank():
    time.sleep(120)
forged_all_reduce_under_roots_rank()
"""


def test_attach_with_pids_reads_and_reports_nothing_of_other_processes(processes, tmp_path):
    """`hangwatch attach --pid A --pid B` as root, beside root's other rank and a second user's
    process that claims rank 0 of the same store (its stack a forged name): only A and B are found,
    and no event, bundle or report names the others or shows the forged frame."""
    port = free_port()
    a = processes.start([sys.executable, "-c", SLEEP], {**rank_env(port), "RANK": "0"})
    b = processes.start([sys.executable, "-c", SLEEP], {**rank_env(port), "RANK": "1", "LOCAL_RANK": "1"})
    other = processes.start([sys.executable, "-c", SLEEP], rank_env(free_port()))
    user = hostile_user()
    forged = user.file(user.home / f"forged-{port}.py", FORGED)
    stranger = processes.start([sys.executable, str(forged)], {**rank_env(port), "RANK": "0"}, user=user)
    time.sleep(0.5)
    incidents = tmp_path / "incidents"
    try:
        watch = subprocess.run([sys.executable, "-m", "ddp_preflight.hangwatch", "attach", "--pid", str(a), "--pid", str(b),
                                "--json", "--threshold", "4", "--for", "12", "--incident-dir", str(incidents)],
                               capture_output=True, text=True, cwd=ROOT, timeout=120)
    finally:
        forged.unlink()
    events = [json.loads(line) for line in watch.stdout.splitlines()]
    found = {e["pid"] for e in events if e["event"] == "rank-found"}
    assert found == {a, b}, ([e["text"] for e in events], watch.stderr[-2000:])
    written = watch.stdout + watch.stderr + "".join(p.read_text() for p in incidents.rglob("*") if p.is_file())
    for pid in (other, stranger):
        assert f'"pid": {pid}' not in written and f"pid {pid}" not in written, pid
    assert "forged_all_reduce" not in written


def test_attach_to_another_users_torchrun_by_pid_follows_it_and_its_rank_and_refuses_nothing(processes):
    """Root gives the pid of a second user's torchrun: the torchrun and the rank it started are
    followed (the user asked for them), and no notice says that user's processes are not followed."""
    user = hostile_user()
    launcher = processes.start([sys.executable, "-c", LAUNCHER, "torchrun", "--nnodes", "1"], rank_env(free_port()),
                               user=user)
    [launched] = processes.children(launcher)
    time.sleep(0.5)
    watch = subprocess.run([sys.executable, "-m", "ddp_preflight.hangwatch", "attach", "--pid", str(launcher), "--json",
                            "--threshold", "4", "--for", "8"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    events = [json.loads(line) for line in watch.stdout.splitlines()]
    assert {e["pid"] for e in events if e["event"] == "rank-found"} == {launched}, [e["text"] for e in events]
    assert not [e["text"] for e in events if "not followed" in e["text"]], [e["text"] for e in events]
