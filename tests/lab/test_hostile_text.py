"""Issue 23, attacks 7 and 11, on a real `--launch` over the lab: a rank's escape sequences (in
its output, its exception's message, its function's name) reach the master's terminal written
out, never raw; and secrets of every shape given to the run (--env, the script's options, hence
the ranks' environments) reach the ranks, and no output and no file of the run holds them."""

from __future__ import annotations

import hashlib
import secrets
import subprocess
import sys
import time
from pathlib import Path

from .test_launch_lab import CLI, NODES, PORT_CHECK, REPO

EVIL = "\x1b]0;pwned\x07\x1b[2J\x1b[H\x9b31m"           # a window title, a clear screen, a C1 CSI
EVIL_SHOWN = "^[]0;pwned^G^[[2J^[[HM-^[31m"
RAW = (b"\x1b", b"\x07", b"\xc2\x9b", b"\r")           # what a terminal would obey (0x9b as UTF-8 sends it)

# Rank 1 raises from a function named with escapes, its message carrying them; every rank first
# prints a line with them (and one that tries to overwrite its own prefix with a carriage return).
RAISES = """
import os, sys, time
EVIL = sys.argv[1]
rank = int(os.environ["RANK"])
print(f"rank {rank} says {EVIL}", flush=True)
print(f"rank {rank} progress\\r[master r0] forged{EVIL}", flush=True)

def step():
    raise RuntimeError("bad shard" + EVIL)

step.__code__ = step.__code__.replace(co_name="step" + EVIL, co_qualname="step" + EVIL)
if rank == 1:
    time.sleep(2)
    step()
time.sleep(60)
"""

# Every rank prints a hash of each variable it was given and of its options (never a value);
# rank 1 then blocks for ever on a lock nobody releases, in a function named with escapes, while
# rank 0 waits for it in all_reduce: a certain hang (a sleeping rank's wait may end by itself and is
# only held), so hangwatch names the deadlock, keeps a bundle, and --stop-on-hang ends the run.
HANGS = """
import hashlib, os, sys, threading, time
import torch
import torch.distributed as dist
names, evil, options = sys.argv[1].split(","), sys.argv[2], sys.argv[3:]
dist.init_process_group("gloo")
rank = dist.get_rank()
for name in names:
    value = os.environ.get(name)
    print(f"rank {rank} got {name} sha256 {hashlib.sha256(value.encode()).hexdigest() if value else None}", flush=True)
print(f"rank {rank} got options sha256 {hashlib.sha256(' '.join(options).encode()).hexdigest()}", flush=True)

def wait():
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()                           # a lock nobody releases

wait.__code__ = wait.__code__.replace(co_name="wait" + evil, co_qualname="wait" + evil)   # py-spy reads the latter
if rank == 1:
    wait()
dist.all_reduce(torch.ones(1))
time.sleep(120)
"""


def launch(lab, tmp_path: Path, script: str, args: list[str], *options: str, timeout: float = 300):
    path = tmp_path / "script.py"
    path.write_text(script)
    argv = [*CLI, *NODES, "--ssh-config", str(lab.ssh_config), "--launch", "--nproc-per-node", "1", "--no-probes",
            "--log-dir", str(tmp_path / "run"), *options, "--", str(path), *args]
    return subprocess.run(argv, capture_output=True, timeout=timeout, cwd=REPO)


def processes(lab) -> dict[str, set[int]]:
    return {node: set(lab.processes(node)) for node in NODES}


def assert_nothing_left(lab, before: dict[str, set[int]], timeout: float = 10) -> None:
    """No process of the run on any node: none that was not there before it (one of the lab's own
    that ended meanwhile is no leftover), once those exiting have gone; the master port is free."""
    deadline = time.monotonic() + timeout
    while (left := {n: pids - before[n] for n, pids in processes(lab).items() if pids - before[n]}) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, left
    bind = lab.exec("master", [sys.executable, "-c", PORT_CHECK])
    assert bind.returncode == 0, f"port 29500 is still held on master: {bind.stderr[-500:]}"


def assert_clean(output: bytes, where: str) -> None:
    for raw in RAW:
        assert raw not in output, (where, raw, output[-3000:])


def test_a_ranks_escape_sequences_reach_the_terminal_written_out(clean_lab, tmp_path):
    before = processes(clean_lab)
    done = launch(clean_lab, tmp_path, RAISES, [EVIL])
    assert done.returncode == 1, (done.stdout[-3000:], done.stderr[-3000:])
    assert b"Traceback" not in done.stderr, done.stderr[-3000:]
    assert_clean(done.stdout, "the ranks' stream")
    assert_clean(done.stderr, "the launcher's lines")
    out, err = done.stdout.decode().splitlines(), done.stderr.decode().splitlines()
    for node, rank in (("master", 0), ("worker1", 1)):
        assert f"[{node} r{rank}] rank {rank} says {EVIL_SHOWN}" in out
        # The carriage return keeps what a terminal would show of the rank's text, after its own prefix.
        assert f"[{node} r{rank}] [master r0] forged{EVIL_SHOWN}" in out
    headline = next(line for line in err if line.startswith("ddp-preflight: training failed: "))
    # The message as the rank's own record has it, or as its output does (whose reader drops the
    # colour-like CSI sequences): either way written out.
    assert headline in (f"ddp-preflight: training failed: rank 1 on worker1 raised RuntimeError: bad shard{shown} "
                        "at script.py:9; every node was stopped"
                        for shown in (EVIL_SHOWN, "^[]0;pwned^GM-^[31m")), headline
    # The node's log keeps the rank's line as it was written (a file, not a terminal).
    assert f"rank 1 says {EVIL}".encode() in (tmp_path / "run" / "worker1.log").read_bytes()
    assert_nothing_left(clean_lab, before)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def alnum(n: int) -> str:
    return "".join(secrets.choice("ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789") for _ in range(n))


def test_no_secret_shape_is_shown_or_kept_and_the_hang_is_shown_written_out(clean_lab, tmp_path):
    before = processes(clean_lab)
    slack, discord = alnum(24), alnum(40)
    aws = "AKIA" + "".join(secrets.choice("ABCDEFGHJKLMNPQRSTUVWXYZ234567") for _ in range(16))
    env = {   # names the old rules missed, and shapes under names that say nothing
        "SSHPASS": "-x" + alnum(12), "GITHUB_PAT": "ghp_" + alnum(36), "GH_PAT": "github_pat_" + alnum(40),
        "NOTIFY_URL": f"https://hooks.slack.com/services/T0AB12CDE/B0FG34HIJ/{slack}", "SETTING_A": aws,
        "HUB": "hf_" + alnum(30) + "7", "CHAT": "xoxb-1234567890-" + alnum(24), "LAB_NOTE": "glpat-" + alnum(20)}
    password, bare, openai = "-x" + alnum(12), "gho_" + alnum(36), "sk-proj-" + alnum(40) + "9"
    options = ["--password", password, "--notify", f"https://discord.com/api/webhooks/112233445566/{discord}",
               bare, "--api", openai]
    given = [word for name, value in env.items() for word in ("--env", f"{name}={value}")]
    done = launch(clean_lab, tmp_path, HANGS, [",".join(env), EVIL, *options], *given, "--stop-on-hang")
    assert done.returncode == 1, (done.stdout[-3000:], done.stderr[-3000:])
    out, err = done.stdout.decode(), done.stderr.decode()
    # The ranks got every value and option as given.
    for node, rank in (("master", 0), ("worker1", 1)):
        for name, value in env.items():
            assert f"[{node} r{rank}] rank {rank} got {name} sha256 {sha256(value)}" in out, (name, out[-3000:])
        assert f"[{node} r{rank}] rank {rank} got options sha256 {sha256(' '.join(options))}" in out
    # Nothing the launch printed or wrote holds one of them: stderr, plan.json, NODE.log, result.json,
    # the bundle's incident.json and report.txt.
    run = tmp_path / "run"
    written = {path: path.read_bytes() for path in run.rglob("*") if path.is_file()}
    names = {path.name for path in written}
    assert {"plan.json", "master.log", "worker1.log", "result.json", "incident.json", "report.txt"} <= names, names
    for value in (*env.values(), slack, discord, aws, password, bare, openai):
        assert value not in out and value not in err, value
        for path, data in written.items():
            assert value.encode() not in data, (value, path)
    assert "SSHPASS=<redacted>" in err and "GITHUB_PAT=<redacted>" in err and "NOTIFY_URL=<redacted>" in err
    assert "--password <redacted> --notify https://discord.com/<redacted> <redacted> --api <redacted>" in err
    # The hang, named with the rank's function written out, on the terminal and in report.txt.
    assert_clean(done.stderr, "the launcher's lines")
    assert_clean(done.stdout, "the ranks' stream")
    said = next(line for line in err.splitlines() if line.startswith("ddp-preflight: hangwatch: DEADLOCK: "))
    line = HANGS.splitlines().index("    lock.acquire()                           # a lock nobody releases") + 1
    assert said.startswith(f"ddp-preflight: hangwatch: DEADLOCK: rank 1 waits on a lock outside any collective: idle at "
                           f"script.py:{line} (wait{EVIL_SHOWN}); rank 0 waits in all_reduce"), said
    report = next(data for path, data in written.items() if path.name == "report.txt")
    assert_clean(report, "report.txt")
    assert f"wait{EVIL_SHOWN}".encode() in report
    assert_nothing_left(clean_lab, before)
