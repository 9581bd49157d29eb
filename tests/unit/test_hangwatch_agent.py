"""What the node's agent runs and writes on behalf of the watcher: never a file another user could
have placed or changed. Real agent processes and files; other users' files are in
tests/lab/test_hangwatch_permissions.py (they need root to make)."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from ddp_preflight.hangwatch.watch import Watcher, WatchTarget, local_py_spy
from ddp_preflight.node import flight, pyspy
from ddp_preflight.transport import LocalNode


def _planted_py_spy(tmp_path):
    """A 'py-spy' in a folder any user may write: whoever wrote it, running it runs their code."""
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, 0o777)
    marker = tmp_path / "it-ran"
    planted = folder / "py-spy"
    planted.write_text(f"#!/bin/sh\ntouch {marker}\n")
    os.chmod(planted, 0o755)
    return planted, marker


def test_a_py_spy_in_a_folder_others_can_write_is_refused_with_why(tmp_path, monkeypatch):
    planted, _ = _planted_py_spy(tmp_path)
    path, refused = pyspy.find(str(planted))
    assert path != str(planted) and "is writable by other users (mode 777)" in refused
    # Nor is it taken when the search for the training environment's own finds it on the PATH.
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-py-spy-here" / "python"))
    monkeypatch.setenv("PATH", str(planted.parent))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert pyspy.find(str(planted)) == (None, refused)
    monkeypatch.undo()
    # Reached through a symlink from a safe folder, it is the same file: refused too.
    safe = tmp_path / "safe"
    safe.mkdir(mode=0o700)
    (safe / "py-spy").symlink_to(planted)
    assert pyspy.find(str(safe / "py-spy"))[0] != str(planted)
    # A safe one is taken as it is.
    os.chmod(planted.parent, 0o755)
    assert pyspy.find(str(planted)) == (str(planted), None)


def test_the_agent_never_runs_a_py_spy_it_may_not_trust_and_says_so(tmp_path):
    planted, marker = _planted_py_spy(tmp_path)
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    events = []
    watcher = Watcher([WatchTarget(LocalNode("here", sys.executable), pids=(rank.pid,))], py_spy=str(planted),
                      on_event=events.append, incident_dir=str(tmp_path / "incidents")).start()
    try:
        deadline = time.monotonic() + 30
        while not any(r.stack_at is not None for r in watcher.state.ranks.values()):      # its stack was taken
            assert time.monotonic() < deadline, [e.text for e in events]
            time.sleep(0.1)
    finally:
        watcher.close()
        rank.kill()
        rank.wait()
    assert not marker.exists()
    notices = [e.text for e in events if e.kind == "notice"]
    assert any(n.startswith(f"here: the agent did not run the py-spy it was given: {planted.parent} is writable "
                            "by other users") for n in notices), notices
    assert watcher.state.hello["here"].py_spy in (None, local_py_spy())


@pytest.fixture
def flight_folder(tmp_path, monkeypatch):
    """The agent's Flight Recorder folder for this process's own uid, under tmp_path."""
    monkeypatch.setattr(flight, "FOLDER_PREFIX", str(tmp_path / "hangwatch-fr-"))
    return tmp_path / f"hangwatch-fr-{os.geteuid()}"


def _answer_once(folder, text):
    """This process as an opted-in rank: answer the agent's request once, as ddp_preflight/hangwatch/flight.py does."""
    def serve():
        for _ in range(100):
            if (folder / f"{os.getpid()}.request").exists():
                (folder / f"{os.getpid()}.json").write_text(text)
                return
            time.sleep(0.02)
    thread = threading.Thread(target=serve)
    thread.start()
    return thread


def test_the_flight_recorder_is_asked_and_read_in_the_ranks_own_folder(flight_folder):
    flight_folder.mkdir(mode=0o700)
    (flight_folder / f"{os.getpid()}.ready").write_text("1")
    entry = {"process_group": ["0", "default_pg"], "collective_seq_id": 12, "profiling_name": "gloo:all_reduce",
             "state": "started"}
    server = _answer_once(flight_folder, json.dumps({"entries": [entry]}))
    found = flight.ask(os.getpid(), wait=3.0)
    server.join()
    assert found == {"groups": [{"group": "default_pg", "id": "0", "seq": 12, "op": "all_reduce", "state": "started",
                                 "completed": None, "last": True}], "entries": 1}
    assert not (flight_folder / f"{os.getpid()}.json").exists()     # read once, then gone


def test_a_flight_folder_that_is_a_symlink_or_others_can_write_is_not_used(flight_folder, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (elsewhere / f"{os.getpid()}.ready").write_text("1")
    flight_folder.symlink_to(elsewhere)
    assert "not used" in flight.ask(os.getpid(), wait=0.2)["error"]
    flight_folder.unlink()
    os.chmod(elsewhere, 0o777)
    elsewhere.rename(flight_folder)
    assert "not the rank's own private folder" in flight.ask(os.getpid(), wait=0.2)["error"]
    # No request was left where anyone could have pointed it.
    assert sorted(p.name for p in flight_folder.iterdir()) == [f"{os.getpid()}.ready"]


def test_the_answer_is_never_read_through_a_link_a_fifo_or_past_its_bound(flight_folder, tmp_path, monkeypatch):
    flight_folder.mkdir(mode=0o700)
    (flight_folder / f"{os.getpid()}.ready").write_text("1")
    answer = flight_folder / f"{os.getpid()}.json"
    secret = tmp_path / "secret.json"
    secret.write_text('{"entries": []}')
    answer.symlink_to(secret)
    assert "unreadable answer" in flight.ask(os.getpid(), wait=0.2)["error"]
    answer.unlink()
    os.mkfifo(answer)
    started = time.monotonic()
    assert "not a file" in flight.ask(os.getpid(), wait=0.2)["error"]
    assert time.monotonic() - started < 2
    monkeypatch.setattr(flight, "ANSWER_LIMIT", 100)
    (flight_folder / f"{os.getpid()}.request").unlink()
    server = _answer_once(flight_folder, json.dumps({"entries": [], "pad": "x" * 200}))
    assert "over" in flight.ask(os.getpid(), wait=3.0)["error"]
    server.join()
    assert secret.read_text() == '{"entries": []}'


def test_the_agent_as_root_runs_ahead_of_the_training_in_the_run_queue():
    # On a loaded box both agents' stacks came 11-12 s after the ask (a full run's trace): as root
    # the agent takes niceness -10, and so do the threads and py-spy it starts.
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from ddp_preflight.node.agent import AHEAD
    assert os.geteuid() == 0, "the suite runs as root"
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            env={**os.environ, "RANK": "0", "WORLD_SIZE": "1"})
    watch = subprocess.Popen([sys.executable, "-m", "ddp_preflight.hangwatch", "attach", "--pid", str(rank.pid), "--json",
                              "--for", "20"], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    try:
        agent = None
        for line in watch.stdout:
            event = json.loads(line)
            if event.get("agent_pid"):
                agent = event["agent_pid"]
                break
        assert agent is not None
        fields = Path(f"/proc/{agent}/stat").read_text().rsplit(")", 1)[1].split()
        assert int(fields[16]) == AHEAD == -10          # stat's 19th field: its niceness
        assert os.getpriority(os.PRIO_PROCESS, 0) == 0  # the watcher itself, and the training, untouched
        assert int(Path(f"/proc/{rank.pid}/stat").read_text().rsplit(")", 1)[1].split()[16]) == 0
    finally:
        watch.kill()
        watch.wait()
        rank.kill()
        rank.wait()
