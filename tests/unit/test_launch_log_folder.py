"""The run's log folder: private to its user, never the run's end when it fails, and a folder
that cannot be written is said before anything starts."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from ddp_preflight.launch.outcome import LaunchedRank, LaunchResult, NodeState, render
from ddp_preflight.launch.output import NodeLogs
from ddp_preflight.node.private import make_folder

REPO = Path(__file__).parents[2]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_run_folder_and_every_file_in_it_are_the_users_alone(tmp_path):
    run = make_folder(tmp_path / "runs" / "one")
    old = run / "master.log"
    old.write_text("an earlier run's line\n")
    old.chmod(0o644)
    logs = NodeLogs(run)
    logs.write_json("plan.json", {"nodes": []})
    logs.write("master", "[master r0] step 0")
    logs.write("worker1", "[worker1 r1] step 0")
    logs.close()
    assert mode(run) == 0o700
    assert {p.name: mode(p) for p in run.iterdir()} == {"plan.json": 0o600, "master.log": 0o600, "worker1.log": 0o600}
    assert old.read_text() == "an earlier run's line\n[master r0] step 0\n"
    assert logs.failure is None


# A write past RLIMIT_FSIZE fails as a full disk does (EFBIG, not ENOSPC): a real failing write
# without root. In a child process: the limit must not reach pytest's own files.
FAILING = """
import json, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
from ddp_preflight.launch.output import NodeLogs
told = []
logs = NodeLogs(sys.argv[1], on_failure=told.append)
logs.write_json("plan.json", {"nodes": []})
for i in range(1000):
    logs.write("master", "[master r0] line %04d %s" % (i, "x" * 40))
logs.write_json("result.json", {"ok": True})
logs.close()
print(json.dumps({"told": told, "failure": logs.failure}))
"""


def test_a_folder_that_fails_stops_the_logs_once_and_raises_nothing(tmp_path):
    done = subprocess.run([sys.executable, "-c", FAILING, str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=60, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert json.loads(done.stdout) == {"told": ["File too large"], "failure": "File too large"}
    written = (tmp_path / "run" / "master.log").read_text()
    every_line = "".join(f"[master r0] line {i:04d} {'x' * 40}\n" for i in range(1000))
    assert 0 < len(written) <= 4096 and every_line.startswith(written)      # what fitted, in order
    assert not (tmp_path / "run" / "result.json").exists()


def test_the_summary_and_the_result_say_the_logs_are_incomplete():
    ranks = [LaunchedRank(0, "master", 0, exit=0)]
    result = LaunchResult(ranks, [NodeState("master", status="exited", exit=0)], None, None, 3.0, "runs/x",
                          logs_error="No space left on device")
    assert result.exit_code == 0       # the logs are not the run
    assert render(result, 29500, "master").splitlines()[-1] == "logs: runs/x (incomplete: No space left on device)"
    assert result.to_json()["logs_complete"] is False and result.to_json()["logs_error"] == "No space left on device"


@contextlib.contextmanager
def read_only_folder(tmp_path: Path):
    """A folder this user cannot write: for root (who writes into any folder whatever its mode) a
    read-only tmpfs mounted there, for another user a folder without its write bit."""
    folder = tmp_path / "logs"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder, "Permission denied"
        return
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)], check=True)
    try:
        yield folder, "Read-only file system"
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_read_only_log_dir_is_one_usage_line_before_anything_runs(tmp_path):
    with read_only_folder(tmp_path) as (folder, why):
        done = subprocess.run([sys.executable, "-m", "ddp_preflight", "--no-probes", "--launch", "--log-dir", str(folder),
                               "--", "train.py"], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 2 and done.stdout == "", done.stdout[-2000:]
    assert done.stderr == (f"ddp-preflight: error: cannot write the logs in {folder} ({why}): "
                           "give --log-dir a folder this user can write to\n")
