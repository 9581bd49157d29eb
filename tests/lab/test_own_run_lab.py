"""Issue 34 part B on the lab: a `--launch --stop-on-hang` over the lab's sshd follows only the
ranks it started. The same user (root) runs on worker1 a torchrun of `--nnodes 3` on another port
that waits in its rendezvous (before: the launch was stopped, 'RENDEZVOUS-STALL', its bundle in
the run's folder), and on master a 1-node run whose rank sleeps: the healthy launch finishes,
writes no incident, names none of their processes, and they still run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).parents[2]
TRAIN = REPO / "examples" / "train_ddp.py"
SLEEPER = "import time\ntime.sleep(300)\n"
MARK = f"OWN_RUN_LAB={os.getpid()}"


def _theirs(lab, node: str) -> set[int]:
    out = set()
    for pid in lab.processes(node):
        try:
            if MARK.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                out.add(pid)
        except OSError:
            pass
    return out


def test_a_healthy_launch_follows_its_own_ranks_alone_beside_another_run_of_its_user(clean_lab, tmp_path):
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text(SLEEPER)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1"]
    others = [
        clean_lab.popen("worker1", ["env", MARK, *torchrun, "--nnodes", "3", "--node-rank", "0", "--master-addr",
                                    clean_lab.node("worker1").ipv4, "--master-port", "29877", str(sleeper)],
                        start_new_session=True),
        clean_lab.popen("master", ["env", MARK, *torchrun, "--nnodes", "1", "--master-addr", "127.0.0.1",
                                   "--master-port", "29878", str(sleeper)], start_new_session=True)]
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(_theirs(clean_lab, "master")) < 2:
            time.sleep(0.2)         # its torchrun and its rank
        assert _theirs(clean_lab, "worker1") and len(_theirs(clean_lab, "master")) >= 2
        theirs = _theirs(clean_lab, "master") | _theirs(clean_lab, "worker1")
        argv = [sys.executable, "-m", "ddp_preflight", "master", "worker1", "--ssh-config", str(clean_lab.ssh_config),
                "--no-probes", "--force", "--launch", "--stop-on-hang", "--nproc-per-node", "2", "--log-dir",
                str(tmp_path / "run"), "--", str(TRAIN), "--steps", "40", "--step-time", "0.5"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO)
        own = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("["))
        assert done.returncode == 0, own[-3000:]
        assert "training finished: all 4 ranks exited with code 0" in done.stderr, own[-3000:]
        assert "RENDEZVOUS" not in done.stderr and "hangwatch named a hang" not in done.stderr, own[-3000:]
        incidents = tmp_path / "run" / "incidents"
        assert not incidents.exists() or not any(incidents.iterdir())
        for path in (p for p in (tmp_path / "run").rglob("*") if p.is_file()):
            text = path.read_text()
            for pid in theirs:
                assert f"pid {pid}" not in text and f'"pid": {pid}' not in text, (path, pid)
        assert all(p.poll() is None for p in others), "another run was stopped"
        assert json.loads((tmp_path / "run" / "result.json").read_text())["ok"] is True
    finally:
        for p in others:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(10)
        for node in ("master", "worker1"):
            for pid in _theirs(clean_lab, node):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def test_attach_to_a_pid_of_no_process_on_a_remote_node_is_one_line_and_exit_2(clean_lab):
    # A --pid on worker1 is known missing only there: its agent says so in its hello.
    done = subprocess.run([sys.executable, "-m", "ddp_preflight.hangwatch", "attach", "master", "worker1", "--ssh-config",
                           str(clean_lab.ssh_config), "--pid", "worker1:999999", "--for", "60"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == ["hangwatch: error: --pid worker1:999999: no such process on worker1; give the "
                                        "pid of a running rank or torchrun (ps -ef)"], done.stderr
    assert "Traceback" not in done.stdout + done.stderr
