"""Issue 34, part A, item 4: another user cannot block root's launch with processes that only
claim to be ranks, and is never offered to `kill`. A real second user (tests/hostile.py) starts
real processes; root runs the real `ddp-preflight` (stale-processes, master-port) on this machine."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp_preflight.node.facts.processes import port_holders, ptrace_facts, training_processes
from ddp_preflight.preflight.checks import BY_ID, run_checks
from ddp_preflight.preflight.model import Context, NodeFacts, Options
from tests.hostile import hostile_user

from .ports import free_port

ROOT = Path(__file__).resolve().parents[2]
HOST = socket.gethostname()
SITE = next(p for p in sys.path if p.endswith("site-packages") and os.path.isdir(os.path.join(p, "torch")))
SLEEPER = "import time; time.sleep(120)"
# The intruder cannot run this venv's Python (it is under /root): the system's, with torch from the venv.
TORCH_SLEEPER = f"import sys; sys.path.insert(0, {SITE!r}); import torch, time; time.sleep(120)"
LISTENER = ("import socket, sys, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
            "s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen(); time.sleep(120)")


def command(*args: str) -> list[str]:
    return [sys.executable, "-P", "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
            "from ddp_preflight.cli.ddp_preflight import main; sys.exit(main())", *args]


@pytest.fixture
def user():
    return hostile_user()


@pytest.fixture
def started():
    """Processes a test starts; each stopped by its own PID after the test."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def checked(port: int, ours: list[subprocess.Popen]) -> dict:
    """master-port and stale-processes on this machine's real facts (the collectors as root, here),
    of the processes this test started: on a shared box other people's runs come and go, and
    each test judges its own."""
    pids = {p.pid for p in ours}
    processes = training_processes(port)
    processes["processes"] = [p for p in processes["processes"] if p["pid"] in pids]
    holders = port_holders(port)
    node = NodeFacts(HOST, {"processes": processes, "ptrace": ptrace_facts(), "master_port": holders})
    results = run_checks(Context((node,), Options(master_port=port)),
                         [BY_ID["master-port"], BY_ID["stale-processes"]])
    return {r.check: r for r in results}


def preflight(port: int) -> dict:
    done = subprocess.run(command("--only", "master-port,stale-processes", "--json", "--master-port", str(port)),
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return {r["check"]: r for r in json.loads(done.stdout)["results"] if r["node"] in (HOST, None)}


def as_rank(user, code: str, *args: str) -> subprocess.Popen:
    env = {**user.env(), "RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "29500"}
    return user.popen(["/usr/bin/python3", "-c", code, *args], env=env, cwd="/", stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL)


def wait_listening(port: int) -> None:
    for _ in range(100):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}")


def test_processes_that_only_claim_rank_are_not_a_stale_run(user, started):
    started += [as_rank(user, SLEEPER), as_rank(user, SLEEPER)]
    time.sleep(0.5)
    stale = preflight(free_port())["stale-processes"]     # the real command, as root

    assert not {p.pid for p in started} & {p["pid"] for p in stale["details"].get("processes", [])}, stale
    assert str(started[0].pid) not in stale["summary"] + (stale["fix"] or "")
    assert checked(free_port(), started)["stale-processes"].summary == "no leftover training processes"


def test_roots_own_rank_only_claim_is_no_proof_either_and_a_torch_rank_of_roots_is_a_leftover(started):
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2"}
    claim = subprocess.Popen([sys.executable, "-c", SLEEPER], env=env)
    real = subprocess.Popen([sys.executable, "-c", TORCH_SLEEPER], env=env, stderr=subprocess.DEVNULL)
    started += [claim, real]
    time.sleep(8)          # torch's import, loaded
    stale = checked(free_port(), started)["stale-processes"]

    assert [p["pid"] for p in stale.details["processes"]] == [real.pid]
    assert stale.status.value == "warn" and stale.summary.startswith(f"1 training process already on {HOST}: "
                                                                     f"PID {real.pid} (")
    assert stale.summary.endswith(" of root") and "torch loaded" in stale.details["processes"][0]["why"]
    assert stale.fix == f"kill {real.pid}   # on {HOST} (owned by root), if they are not a run you want"


def test_another_users_torch_rank_is_named_with_its_owner_and_never_killed(user, started):
    rank = as_rank(user, TORCH_SLEEPER)
    started.append(rank)
    time.sleep(8)
    stale = checked(free_port(), started)["stale-processes"]

    assert stale.status.value == "warn", stale
    assert stale.summary.startswith(f"1 training process of another user on {HOST}: PID {rank.pid} (")
    assert stale.summary.endswith(f" of {user.name}: not this user's to stop"), stale.summary
    assert stale.fix == (f"ask {user.name} whether it is a run of theirs on {HOST}; it shares the node's "
                                "CPUs, GPUs and ports with yours")


def test_another_users_process_on_the_master_port_is_named_and_the_fix_is_another_port(user, started):
    port = free_port()
    holder = as_rank(user, LISTENER, str(port))
    started.append(holder)
    wait_listening(port)
    results = checked(port, started)

    master = results["master-port"]
    assert master.status.value == "fail" and f"PID {holder.pid} (" in master.summary, master
    assert f" of {user.name}: rendezvous fails with EADDRINUSE" in master.summary, master.summary
    assert master.fix == (f"--master-port 29500   # another port for the run; {port} is held by "
                                 f"{user.name}'s PID {holder.pid}: ask {user.name}, it is not yours to stop")
    stale = results["stale-processes"]
    assert stale.status.value == "warn" and "kill" not in stale.fix
    assert f"holds port {port}" in stale.details["processes"][0]["why"]
    # The real command says the same of the port (other runs on this box aside).
    assert "kill" not in (preflight(port)["master-port"]["fix"] or "")


def test_a_rank_of_another_preflights_running_probe_job_is_named_as_that_and_never_offered_to_kill(started):
    # Two preflights at once (s43's audit: the second offered `kill` for the first's root probe
    # rank). A rank of a probe job runs `-m ddp_preflight.node.jobs.<job>` under a live node
    # program (its boot line); the same command whose program is gone is a leftover like any other.
    from ddp_preflight.node.boot import STAGE0

    rank_code = f"{TORCH_SLEEPER}"
    spawn = ("import subprocess, sys, time; "
             f"c = subprocess.Popen([sys.executable, '-c', {rank_code!r}, 'ddp_preflight.node.jobs.probes']); "
             "print(c.pid, flush=True); time.sleep(120)")
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2"}
    program = subprocess.Popen([sys.executable, "-c", spawn, STAGE0], env=env, stdout=subprocess.PIPE, text=True,
                               stderr=subprocess.DEVNULL)
    started.append(program)
    rank = int(program.stdout.readline())
    started.append(type("Rank", (), {"pid": rank, "wait": lambda self: None})())
    time.sleep(8)          # torch's import, loaded
    stale = checked(free_port(), started)["stale-processes"]

    assert [p["pid"] for p in stale.details["processes"]] == [rank]
    assert (stale.status.value, stale.summary) == (
        "warn", f"another ddp-preflight run's probes job is running on {HOST} now (1 rank: PID {rank}; its node "
                f"program PID {program.pid} of root): not a leftover, it ends by itself")
    assert stale.fix == (f"wait for that run's probes to end, then run preflight again: two preflights at once share "
                         f"{HOST}'s CPUs and ports, and each one's figures")
    # Its program gone (the rank orphaned): a leftover, offered to kill as any other.
    os.kill(program.pid, signal.SIGKILL)
    program.wait()
    started.remove(program)
    stale = checked(free_port(), started)["stale-processes"]
    assert stale.summary.startswith(f"1 training process already on {HOST}"), stale.summary
    assert stale.fix.startswith(f"kill {rank}   # on {HOST}"), stale.fix
