"""hangwatch without permission to ptrace the ranks (here: run as `nobody`, the ranks as root):
it says so once, with the fix, and keeps diagnosing from CPU and /proc alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import shutil
import tempfile
import threading
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "examples" / "hang_train.py"
pytestmark = pytest.mark.timeout(120)


def test_no_ptrace_permission_gives_the_fix_and_still_names_the_stall():
    # pytest's tmp_path sits under a folder only root may enter: nobody needs its own.
    tmp_path = Path(tempfile.mkdtemp(prefix="hangwatch-nobody-"))
    incidents = tmp_path / "incidents"
    incidents.mkdir()
    os.chmod(tmp_path, 0o777)
    os.chmod(incidents, 0o777)
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                            "--master-addr", "127.0.0.1", "--master-port", "29641", str(SCRIPT),
                            "--steps", "500", "--fault", "leave", "--rank", "1", "--at", "5"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    watch = subprocess.Popen(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                              sys.executable, "-m", "hangwatch.cli", "attach", "--json", "--threshold", "6",
                              # The agent needs only the standard library; the venv's Python may sit
                              # under root's home, where nobody cannot run it.
                              "--python", "/usr/bin/python3",
                              "--incident-dir", str(incidents), "--exit-on-hang", "--for", "60"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=Path(__file__).parents[2], env={**os.environ, "HOME": str(tmp_path)})
    events = []
    reader = threading.Thread(target=lambda: events.extend(json.loads(l) for l in watch.stdout), daemon=True)
    reader.start()
    try:
        code = watch.wait(90)
        # This job's ranks, while they still run: torchrun's children.
        ours = {int(p) for p in subprocess.run(["pgrep", "-P", str(job.pid)], capture_output=True,
                                                text=True).stdout.split()}
        reader.join(5)
    finally:
        if watch.poll() is None:
            watch.kill()
        os.killpg(job.pid, signal.SIGTERM)
        job.wait(20)
        shutil.rmtree(tmp_path, ignore_errors=True)
    stderr = watch.stderr.read()
    assert "Traceback" not in stderr, stderr
    kinds = [e["event"] for e in events]
    notices = [e["text"] for e in events if e["event"] == "notice"]
    assert any("not permitted to read the stacks" in n and "run hangwatch as the user who runs the training"
               in n and "ptrace_scope" in n for n in notices), notices
    assert any("cannot read" in e["text"] and "environment" in e["text"] for e in events if e["event"] == "notice"), \
        [e["text"] for e in events]
    # Both ranks of this job are found, through their torchrun parent (nobody cannot read their
    # environment; other jobs' ranks on this machine may be found too).
    found = {e["pid"] for e in events if e["event"] == "rank-found"}
    assert len(ours) == 2 and ours <= found, (ours, found, kinds)
    diagnosis = next(e for e in events if e["event"] == "diagnosis")["snapshot"]["diagnosis"]
    assert code == 1 and diagnosis["kind"] == "stall", diagnosis
    assert "no CPU" in diagnosis["summary"] and "stacks unavailable" in diagnosis["summary"]
