"""What the node's agent runs and writes on behalf of the watcher: never a file another user could
have placed or changed. Real agent processes and files; other users' files are in
tests/lab/test_hangwatch_permissions.py (they need root to make)."""

import os
import subprocess
import sys
import time

from hangwatch import agent
from hangwatch.watch import Watcher, WatchTarget, local_py_spy


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


def test_a_py_spy_in_a_folder_others_can_write_is_refused_with_why(tmp_path):
    planted, _ = _planted_py_spy(tmp_path)
    path, refused = agent.find_py_spy(str(planted))
    assert path != str(planted) and "is writable by other users (mode 777)" in refused
    # Reached through a symlink from a safe folder, it is the same file: refused too.
    safe = tmp_path / "safe"
    safe.mkdir(mode=0o700)
    (safe / "py-spy").symlink_to(planted)
    assert agent.find_py_spy(str(safe / "py-spy"))[0] != str(planted)
    # A safe one is taken as it is.
    os.chmod(planted.parent, 0o755)
    assert agent.find_py_spy(str(planted)) == (str(planted), None)


def test_the_agent_never_runs_a_py_spy_it_may_not_trust_and_says_so(tmp_path):
    planted, marker = _planted_py_spy(tmp_path)
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    events = []
    watcher = Watcher([WatchTarget("here", sys.executable, pids=(rank.pid,))], py_spy=str(planted),
                      on_event=events.append, incident_dir=str(tmp_path / "incidents")).start()
    try:
        deadline = time.monotonic() + 30
        while not any(r.stack_at is not None for r in watcher.ranks.values()):      # its stack was taken
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
    assert watcher.hello["here"]["py_spy"] in (None, local_py_spy())
