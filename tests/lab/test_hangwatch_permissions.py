"""hangwatch and other users: without permission to ptrace the ranks (here: run as `nobody`, the
ranks as root) it says so once, with the fix, and keeps diagnosing from CPU and /proc alone; and
what it runs or writes as root never lives where another user (`nobody`) can place it first."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from ddp_preflight.hangwatch.watch import local_py_spy

from .hangjob import hangwatch, start_job

SCRIPT = Path(__file__).parents[2] / "examples" / "hang_train.py"
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
pytestmark = pytest.mark.timeout(120)


def test_no_ptrace_permission_gives_the_fix_and_still_names_the_stall():
    # pytest's tmp_path sits under a folder only root may enter: nobody needs its own.
    tmp_path = Path(tempfile.mkdtemp(prefix="hangwatch-nobody-"))
    incidents = tmp_path / "incidents"
    incidents.mkdir()
    os.chmod(tmp_path, 0o777)
    os.chmod(incidents, 0o777)
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                            "--master-addr", "127.0.0.1", "--master-port", "29661", str(SCRIPT),
                            "--steps", "500", "--fault", "leave", "--rank", "1", "--at", "5"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    # This job's ranks: torchrun's children (root's, as every other root run on this machine).
    ours: set[int] = set()
    deadline = time.monotonic() + 60
    while len(ours) < 2 and time.monotonic() < deadline:
        ours = {int(p) for p in subprocess.run(["pgrep", "-P", str(job.pid)], capture_output=True,
                                                text=True).stdout.split()}
        time.sleep(0.2)
    # Without --exit-on-hang: nobody cannot read root's environments, so it sees every root run
    # on this machine (other tests' too), each judged alone; the first hang named may be another's.
    watch = subprocess.Popen(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                              sys.executable, "-m", "ddp_preflight.hangwatch", "attach", "--json", "--threshold", "6",
                              # The agent needs only the standard library; the venv's Python may sit
                              # under root's home, where nobody cannot run it.
                              "--python", "/usr/bin/python3",
                              "--incident-dir", str(incidents), "--for", "80"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=Path(__file__).parents[2], env={**os.environ, "HOME": str(tmp_path)})
    events: list = []
    named = threading.Event()

    def about_ours(event: dict) -> bool:
        if event["event"] != "diagnosis":
            return False
        return any(e.get("pid") in ours for e in event["snapshot"]["diagnosis"].get("evidence") or ())

    def read() -> None:
        for line in watch.stdout:
            events.append(json.loads(line))
            if about_ours(events[-1]):
                named.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        named.wait(90)
    finally:
        if watch.poll() is None:
            watch.terminate()
            watch.wait(20)
        reader.join(5)
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
    diagnosis = next(e for e in events if about_ours(e))["snapshot"]["diagnosis"]
    assert diagnosis["kind"] == "stall", diagnosis
    assert "no CPU" in diagnosis["summary"] and "stacks unavailable" in diagnosis["summary"]


@pytest.mark.parametrize("planted", ["file", "symlink"])
def test_a_py_spy_path_another_user_placed_first_is_never_written_or_run(clean_lab, tmp_path, planted):
    # The name hangwatch used to copy py-spy to, predictable by anyone: nobody makes it first, as
    # a script anyone may rewrite (run as root, it would say so in `witness`), or as a symlink to
    # a root-only file.
    known = Path(f"/tmp/hangwatch-py-spy-{os.getuid()}-{os.path.getsize(local_py_spy())}")
    assert not os.path.lexists(known), f"{known} is left from an earlier run: remove it"
    witness = Path(tempfile.mkdtemp(prefix="hangwatch-witness-"))
    os.chmod(witness, 0o777)
    precious = tmp_path / "root-only"          # tmp_path: a folder only root may enter
    precious.write_text("root's own\n")
    os.chmod(precious, 0o600)
    if planted == "file":
        subprocess.run(AS_NOBODY + ["sh", "-c", f"printf '#!/bin/sh\\nid > {witness}/ran\\n' > {known}; "
                                    f"chmod 777 {known}"], check=True)
    else:
        subprocess.run(AS_NOBODY + ["ln", "-s", str(precious), str(known)], check=True)
    before = (known.lstat(), os.readlink(known) if planted == "symlink" else known.read_bytes())
    try:
        # /usr/bin/python3 has no py-spy beside it on the nodes: the watch has to bring one.
        watch = hangwatch(clean_lab, "--python", "/usr/bin/python3", "--incident-dir", str(tmp_path / "incidents"))
        job = start_job(clean_lab, "--steps", "500", "--fault", "leave", "--rank", "3", "--at", "5",
                        port=29663 if planted == "file" else 29664)
        try:
            copied = watch.wait_for("notice", 60, lambda e: e["text"].startswith("worker1: py-spy was missing"))
            diagnosis = watch.wait_for("diagnosis", 60)["snapshot"]["diagnosis"]
        finally:
            job.stop()
            watch.stop()
        after = (known.lstat(), os.readlink(known) if planted == "symlink" else known.read_bytes())
        ran = (witness / "ran").exists()
    finally:
        known.unlink()
        shutil.rmtree(witness)
    assert "Traceback" not in watch.stderr, watch.stderr
    # The planted name was neither written nor run, and root's file behind the symlink is untouched.
    assert (after[0].st_uid, after[0].st_mode, after[0].st_size, after[1]) == \
        (before[0].st_uid, before[0].st_mode, before[0].st_size, before[1])
    assert not ran
    assert precious.read_bytes() == b"root's own\n" and stat.S_IMODE(precious.stat().st_mode) == 0o600
    # Brought to a folder made for this watch, and gone with it.
    folder = Path(copied["text"].split(" to ")[1].split()[0]).parent
    assert folder.parent == Path("/tmp") and folder.name.startswith("hangwatch-") and folder != known.parent
    assert not folder.exists()
    # The stacks were taken with it: the deadlock is named with its rank and line.
    assert diagnosis["kind"] == "deadlock" and diagnosis["culprits"] == [3], diagnosis
    assert "rank 3 left the loop: idle at hang_train.py:" in diagnosis["summary"]


# Run in a mount namespace of its own on a fresh /tmp: the machine's /tmp, where other runs keep
# their Flight Recorder folders, is never touched. Prints what happened as JSON.
FLIGHT_SCENE = """
import json, os, subprocess, sys, time
# A checkout (or its venv) under /tmp stays in sight: bound back over the fresh /tmp.
keep = sorted({p for p in (os.getcwd(), sys.prefix) if p.startswith("/tmp/")}, key=len)
keep = [p for p in keep if not any(p.startswith(k + "/") for k in keep if k != p)]
held = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in keep}
subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", "/tmp"], check=True)
for path, fd in held.items():
    os.makedirs(path)
    subprocess.run(["mount", "--no-canonicalize", "--bind", f"/proc/{os.getpid()}/fd/{fd}", path], check=True)
as_nobody, planted = json.loads(sys.argv[1]), sys.argv[2]
theirs = ["/tmp/hangwatch-fr", "/tmp/hangwatch-fr-0"]      # the names hangwatch used before, and now
if planted == "symlink":
    subprocess.run(as_nobody + ["mkdir", "-m", "777", "/tmp/theirs"], check=True)
    for name in theirs:
        subprocess.run(as_nobody + ["ln", "-s", "/tmp/theirs", name], check=True)
else:
    for name in theirs:
        subprocess.run(as_nobody + ["mkdir", "-m", "777", name], check=True)
# A rank of root's that opts in, as a training script would.
with open("/tmp/rank.err", "w") as err:
    rank = subprocess.Popen([sys.executable, "-c", "import ddp_preflight.hangwatch.flight, time; print(1, flush=True); "
                             "time.sleep(60)"], stdout=subprocess.PIPE, stderr=err)
rank.stdout.readline()
# nobody lures the agent: this rank's ready file, where nobody can write.
for folder in (["/tmp/theirs"] if planted == "symlink" else theirs):
    subprocess.run(as_nobody + ["touch", f"{folder}/{rank.pid}.ready"])
from ddp_preflight.node.flight import ask as flight
answer = flight(rank.pid, wait=1.0)
rank.kill()
rank.wait()
left = {f: sorted(os.listdir(f)) for f in (["/tmp/theirs"] if planted == "symlink" else theirs)}
print(json.dumps({"pid": rank.pid, "answer": answer, "left": left, "rank_err": open("/tmp/rank.err").read()}))
"""


@pytest.mark.parametrize("planted", ["symlink", "folder"])
def test_a_flight_recorder_folder_another_user_placed_first_is_never_used(planted):
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-c", FLIGHT_SCENE,
                           json.dumps(AS_NOBODY), planted], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    # Neither the rank (root) nor the agent (root) wrote anything where nobody pointed them: only
    # nobody's own lure is there.
    assert all(names == [f"{seen['pid']}.ready"] for names in seen["left"].values()), seen
    assert "Traceback" not in seen["rank_err"], seen["rank_err"]
    why = ("/tmp/hangwatch-fr-0 is not a folder but a symlink" if planted == "symlink"
           else "/tmp/hangwatch-fr-0 belongs to uid 65534, not to this user (uid 0)")
    assert seen["rank_err"] == (f"ddp_preflight.hangwatch.flight: the Flight Recorder fetch is off: {why}; another user may "
                                "have made it first. Fix: remove it (`sudo rm -rf /tmp/hangwatch-fr-0`) and restart\n")
    assert "/tmp/hangwatch-fr-0 not used" in seen["answer"]["error"], seen["answer"]


@pytest.mark.parametrize("lure", ["a thread's ready file", "an NCCL pipe"])
def test_a_rank_that_names_another_users_folder_for_its_flight_recorder_is_not_asked_there(tmp_path, lure):
    """A launched rank says where its Flight Recorder is (DDP_PREFLIGHT_FLIGHT_RECORDER): a rank of
    nobody's that names root's private folder, with a lure in it, gets no request from the agent
    (root) there, nor a line in its pipe: the folder must be the rank's user's own."""
    from ddp_preflight.node.flight import FOLDER_VARIABLE, ask

    roots = tmp_path / "root-only"
    roots.mkdir(mode=0o700)
    os.chmod(tmp_path, 0o755)        # nobody may look up the path, not write in it
    rank = subprocess.Popen(AS_NOBODY + ["env", f"{FOLDER_VARIABLE}={roots}", "RANK=0", "sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        # Its environment is set: exec names the process before it places the new environment, so
        # the name alone can come while /proc still shows none (the agent then sees no folder).
        while Path(f"/proc/{rank.pid}/comm").read_text().strip() != "sleep" or \
                FOLDER_VARIABLE.encode() not in Path(f"/proc/{rank.pid}/environ").read_bytes():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        if lure == "an NCCL pipe":
            os.mkfifo(roots / "nccl-pipe-0.pipe", 0o600)
            reader = os.open(roots / "nccl-pipe-0.pipe", os.O_RDONLY | os.O_NONBLOCK)
        else:
            (roots / f"{rank.pid}.ready").write_text("1")
        answer = ask(rank.pid, wait=1.0, pipe_wait=1.0)
    finally:
        rank.kill()
        rank.wait()
    assert f"{roots} not used: it is not the rank's own private folder" in answer["error"], answer
    assert sorted(p.name for p in roots.iterdir()) == (["nccl-pipe-0.pipe"] if lure == "an NCCL pipe"
                                                      else [f"{rank.pid}.ready"])
    if lure == "an NCCL pipe":
        assert os.read(reader, 16) == b""      # nothing was written to it (and no writer holds it)
        os.close(reader)
