"""Issue 34, part A, item 1 on remote nodes: `--env LD_PRELOAD=<another user's library>` in a
plain preflight over the lab's real sshd. Before, root's `ip`, `git`, the import scan and every
rank on each node loaded it and the report said all passed; now nothing loads it anywhere (the
library leaves a marker with its uid when loaded), each node refuses it in one line, and the same
preflight with root's own library folder passes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid

import pytest

from tests.hostile import hostile_user
from tests.unit.test_hostile_env import planted_library

pytestmark = pytest.mark.timeout(300)
CLI = [sys.executable, "-m", "ddp_preflight"]
NODES = ("master", "worker1")


def preflight(clean_lab, cwd, *args: str) -> dict:
    done = subprocess.run([*CLI, *NODES, "--ssh-config", str(clean_lab.ssh_config), "--json", *args],
                          capture_output=True, text=True, timeout=240, cwd=cwd)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return {(r["check"], r["node"]): r for r in json.loads(done.stdout)["results"]}


def test_ld_preload_of_another_user_loads_on_no_node_and_each_node_refuses_it(clean_lab, tmp_path):
    user = hostile_user()
    markers = tmp_path / "markers"
    markers.mkdir()
    markers.chmod(0o777)
    shared = user.home / f"env-{uuid.uuid4().hex[:8]}"
    user.run(["mkdir", "-m", "755", str(shared)])
    (tmp_path / "train.py").write_text("import json\nprint(json.dumps(1))\n")
    try:
        library = planted_library(user, shared, markers)
        results = preflight(clean_lab, tmp_path, "--only", "node-reachable,training-imports,code-parity",
                            "--env", f"LD_PRELOAD={library}", "--", "train.py")
    finally:
        shutil.rmtree(shared, ignore_errors=True)

    assert sorted(p.name for p in markers.iterdir()) == []
    for node in NODES:
        assert results[("node-reachable", node)]["status"] == "pass"
        imports = results[("training-imports", node)]
        assert (imports["status"], imports["summary"]) == (
            "error", f"{node}: the training command's imports were not resolved: the training's LD_PRELOAD file "
                     f"{library} belongs to ddpp-intruder (uid {user.uid}), who could change what the ranks load as "
                     "root")


def test_roots_own_library_folder_passes_on_every_node(clean_lab, tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (tmp_path / "train.py").write_text("import json\nprint(json.dumps(1))\n")
    results = preflight(clean_lab, tmp_path, "--only", "node-reachable,training-imports",
                        "--env", f"LD_LIBRARY_PATH={lib}", "--", "train.py")
    assert [results[("training-imports", node)]["status"] for node in NODES] == ["pass", "pass"], results
