"""Issue 23, attack 2 on remote nodes: the agent on each lab node finds a py-spy beside --python
that the intruder placed, while the master has its own trusted py-spy. The intruder's is never
run; the agent says which it refused and why, the master brings its own, and the stacks are
taken with that one: the deadlock is named with its rank and line."""

from __future__ import annotations

import shutil
import uuid

import pytest

from tests.hostile import hostile_user

from .hangjob import NODES, hangwatch, start_job

pytestmark = pytest.mark.timeout(240)


def test_a_py_spy_the_intruder_placed_beside_python_on_the_nodes_is_never_run(clean_lab, tmp_path):
    user = hostile_user()
    markers = tmp_path / "markers"
    markers.mkdir()
    shared = user.home / f"exec-{uuid.uuid4().hex[:8]}"
    user.run(["mkdir", "-m", "777", str(shared)])
    user.run(["sh", "-c", f'printf "#!/bin/sh\\ntouch {markers}/py-spy\\n" > {shared}/py-spy; chmod 755 {shared}/py-spy'])
    # root's training environment on the nodes (the lab's nodes share this file system): its
    # Python is the system's, and a py-spy beside it links to the intruder's file.
    env_bin = tmp_path / "env" / "bin"
    env_bin.mkdir(parents=True)
    (env_bin / "python").symlink_to("/usr/bin/python3")
    (env_bin / "py-spy").symlink_to(shared / "py-spy")
    try:
        watch = hangwatch(clean_lab, "--python", str(env_bin / "python"), "--incident-dir", str(tmp_path / "incidents"))
        job = start_job(clean_lab, "--steps", "500", "--fault", "leave", "--rank", "3", "--at", "5", port=29645)
        try:
            for node in NODES:
                watch.wait_for("notice", 90, lambda e, n=node: e["text"].startswith(f"{n}: py-spy was missing"))
            diagnosis = watch.wait_for("diagnosis", 90)["snapshot"]["diagnosis"]
        finally:
            job.stop()
            watch.stop()
    finally:
        shutil.rmtree(shared, ignore_errors=True)

    assert sorted(p.name for p in markers.iterdir()) == []
    assert "Traceback" not in watch.stderr, watch.stderr
    refused = [e["text"] for e in watch.events if e["event"] == "notice" and "did not run" in e["text"]]
    assert sorted(refused) == [
        f"{node}: the agent did not run the py-spy at {env_bin}/py-spy: {shared}/py-spy belongs to ddpp-intruder "
        f"(uid {user.uid}), not to root or this user (root, uid 0); stacks are missing; fix: pip install py-spy "
        "in the training environment on that node" for node in NODES], refused
    # The stacks were taken with the master's own py-spy, brought to each node.
    assert diagnosis["kind"] == "deadlock" and diagnosis["culprits"] == [3], diagnosis
    assert "rank 3 left the loop: idle at hang_train.py:" in diagnosis["summary"]
