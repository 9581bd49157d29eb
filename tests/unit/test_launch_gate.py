"""The probes inside the training's ranks, behind the master's gate (issue 36): the launch program
with "probes" runs node/jobs/probes.py's parts in every rank through rank_bootstrap.py, each rank
says GATE and waits; only the master's "open-gate" (through the supervisor, into the launch
program's private folder) lets the script's first line run, and a stop before it ends the ranks
with no line of the script run. Real torchrun, real Gloo on loopback, the real supervisor."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from ddp_preflight.node import flight, protocol, rank_bootstrap, supervisor
from ddp_preflight.transport import LocalNode

from .ports import free_port

BOOTSTRAP = Path(rank_bootstrap.__file__)

TRAIN = """\
import json, os, sys, time
print("first line of train.py", flush=True)
def links():
    for fd in os.listdir("/proc/self/fd"):
        try:
            yield os.readlink("/proc/self/fd/" + fd)
        except OSError:
            pass
sockets = sum(link.startswith("socket:") for link in links())
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
print("seen", json.dumps({"rank": dist.get_rank(), "pid": os.getpid(), "sockets": sockets, "sum": t.item(),
      "threads": torch.get_num_threads(),
      "ours": sorted(k for k in os.environ if k.startswith("DDP_PREFLIGHT_") and "FLIGHT" not in k),
      "gloo": os.environ.get("GLOO_SOCKET_IFNAME"), "omp": os.environ.get("OMP_NUM_THREADS"),
      "argv": sys.argv, "modules": sorted(m for m in sys.modules if m.startswith("ddp_preflight"))}), flush=True)
dist.barrier()
# Until the test has asked hangwatch's way for this rank's Flight Recorder.
for _ in range(400):
    if os.path.exists(os.path.join(os.path.dirname(__file__), "asked")):
        break
    time.sleep(0.05)
dist.destroy_process_group()
"""

# Every part, as together.py's shared job asks for them: the collectives pinned to an interface
# (so the probe changes GLOO_SOCKET_IFNAME), compute with a thread count other than the ranks'.
PARTS = ["--compute", json.dumps([{"threads": 1, "seconds": 0.2}]),
         "--collectives", json.dumps(["--backend", "gloo", "--device", "cpu", "--ifnames", json.dumps(["lo"])]),
         "--bandwidth", json.dumps(["--backend", "gloo"])]


def gated_launch(tmp_path: Path, parts: list[str]):
    """The launch program with the probes in its 2 ranks; (job, [(seconds, line)])."""
    (tmp_path / "train.py").write_text(TRAIN)
    lines: list[tuple[float, str]] = []
    started = time.monotonic()
    job = LocalNode("here", sys.executable).job(
        {"program": "launch", "cwd": str(tmp_path), "module": False, "flight_recorder": True,
         "probes": {"args": parts, "store_token": secrets.token_hex(16)},
         "torchrun": ["--nproc-per-node", "2", "--master-port", str(free_port()), "--tee", "3",
                      str(tmp_path / "train.py"), "--", "--steps", "3"]},
        env={"OMP_NUM_THREADS": "2"}, timeout=120, on_line=lambda line: lines.append((time.monotonic() - started, line)))
    return job, lines


def texts(lines) -> list[str]:
    return [line for _, line in list(lines)]


def waiting(lines) -> list[dict]:
    """The ranks' GATE lines (torchrun's "[defaultN]:" in front)."""
    return [json.loads(line.split(protocol.GATE, 1)[1]) for line in texts(lines) if protocol.GATE in line]


def wait_for(predicate, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(what)


def test_the_ranks_run_every_probe_then_the_script_only_after_the_masters_word(tmp_path):
    job, lines = gated_launch(tmp_path, PARTS)
    try:
        wait_for(lambda: len(waiting(lines)) == 2, 90, f"the ranks never waited at the gate: {texts(lines)[-5:]}")
        time.sleep(0.5)        # a rank past the gate would print its first line now
        assert not any("first line of train.py" in t for t in texts(lines))
        assert job.send({"cmd": "open-gate"})
        wait_for(lambda: sum("seen {" in t for t in texts(lines)) == 2, 60, f"no script line: {texts(lines)[-5:]}")
        pids = [json.loads(t.split("seen ", 1)[1])["pid"] for t in texts(lines) if "seen {" in t]
        recorded = [flight.ask(pid, wait=5.0) for pid in pids]
        (tmp_path / "asked").touch()
        result = job.wait(60)
    finally:
        job.stop()
    said = texts(lines)
    assert sorted(w["rank"] for w in waiting(lines)) == [0, 1] and all(w["error"] is None for w in waiting(lines))
    # Each part's own lines, as its own job prints them: one figure of compute (node rank 0's
    # local rank 0), every collectives case of both ranks, rank 0's bandwidth.
    assert sum(protocol.COMPUTE in t for t in said) == 1
    assert sum('"event": "done"' in t and protocol.COLLECTIVES in t for t in said) == 2
    assert sum(protocol.BANDWIDTH in t for t in said) == 1
    gate_at = max(at for at, line in lines if protocol.GATE in line)
    first_at = min(at for at, line in lines if "first line of train.py" in line)
    assert gate_at < first_at
    seen = [json.loads(t.split("seen ", 1)[1]) for t in said if "seen {" in t]
    assert sorted(s["rank"] for s in seen) == [0, 1]
    for s in seen:
        # The training's own group formed after the probes' (their keys apart), and nothing the
        # probes changed reached the script: interface, threads, variables, argv, modules.
        assert s["sum"] == 2.0
        assert (s["gloo"], s["omp"], s["threads"]) == (None, "2", 2)
        assert s["ours"] == [] and s["modules"] == []
        assert s["argv"] == [str(tmp_path / "train.py"), "--steps", "3"]
        # No connection of the probes' left open (their store clients, their groups' pairs):
        # hangwatch tells ranks that train alone by the connections they never made.
        assert s["sockets"] == 0
    assert result.exit == 0, said[-5:]
    # hangwatch reads the script's collectives alone: the probes' hundred and more ran in a group
    # "0" too, with sequence numbers the script's own group starts again from 1.
    for found in recorded:
        assert found is not None and found["entries"] == 2, found
        assert [(g["id"], g["seq"], g["op"]) for g in found["groups"]] == [("0", 2, "barrier")], found


def test_without_the_masters_word_no_line_of_the_script_runs(tmp_path):
    job, lines = gated_launch(tmp_path, [])      # no probe: the gate alone
    try:
        wait_for(lambda: len(waiting(lines)) == 2, 60, f"the ranks never waited at the gate: {texts(lines)[-5:]}")
        time.sleep(0.5)
    finally:
        job.stop()              # NOT READY: the master stops the launch
    result = job.wait(30)
    assert not any("first line of train.py" in t for t in texts(lines)), texts(lines)
    exits = [d for d in (protocol.parse(t, protocol.LAUNCH) for t in texts(lines)) if d and d.get("kind") == "exits"]
    assert [r["signal"] for r in exits[0]["ranks"]] == [15, 15]
    assert result.stopped == "asked"


def bootstrapped(tmp_path: Path, folder: Path) -> subprocess.Popen:
    """The bootstrap alone (no torchrun), with its gate in `folder`."""
    (tmp_path / "train.py").write_text('print("first line of train.py", flush=True)\n')
    env = {**os.environ, rank_bootstrap.GATE_VARIABLE: str(folder), rank_bootstrap.PROBES_VARIABLE: "[]"}
    return subprocess.Popen([sys.executable, "-u", str(BOOTSTRAP), str(tmp_path / "train.py")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_gate_folder_another_user_could_write_is_not_waited_on(tmp_path):
    folder = tmp_path / "gate"
    folder.mkdir()
    folder.chmod(0o777)
    rank = bootstrapped(tmp_path, folder)
    out, err = rank.communicate(timeout=30)
    assert rank.returncode == rank_bootstrap.NOT_OWN_FOLDER
    assert out == "" and f"{folder} is not this rank's own private folder" in err


def test_only_a_file_of_the_ranks_own_user_opens_the_gate_not_a_link(tmp_path):
    folder = tmp_path / "gate"
    folder.mkdir(mode=0o700)
    (tmp_path / "elsewhere").write_text("")
    (folder / rank_bootstrap.GATE_OPEN).symlink_to(tmp_path / "elsewhere")
    rank = bootstrapped(tmp_path, folder)
    try:
        assert rank.stdout is not None
        assert rank.stdout.readline().startswith(protocol.GATE)
        time.sleep(0.5)
        assert rank.poll() is None      # still at the gate: a link is not the master's word
        (folder / rank_bootstrap.GATE_OPEN).unlink()
        supervisor.asked({"cmd": "open-gate"}, {"program": "launch", "probes": {"args": []}}, rank.pid, str(folder))
        assert rank.stdout.readline() == "first line of train.py\n"
        assert rank.wait(30) == 0
    finally:
        rank.kill()
        rank.wait()


def test_the_supervisor_opens_the_gate_of_a_gated_launch_only(tmp_path):
    for job in ({"program": "launch"}, {"program": "torchjob", "probes": {"args": []}}):
        supervisor.asked({"cmd": "open-gate"}, job, os.getpid(), str(tmp_path))
        assert not (tmp_path / rank_bootstrap.GATE_OPEN).exists()
    for _ in range(2):      # said twice: the same word
        supervisor.asked({"cmd": "open-gate"}, {"program": "launch", "probes": {"args": []}}, os.getpid(), str(tmp_path))
    word = tmp_path / rank_bootstrap.GATE_OPEN
    assert word.is_file() and oct(word.stat().st_mode & 0o777) == oct(0o600)


def test_the_rank_says_gate_as_the_protocol_declares_it():
    assert rank_bootstrap.GATE_LINE == protocol.GATE
