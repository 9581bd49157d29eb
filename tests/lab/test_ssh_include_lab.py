"""OpenSSH's Include over real ssh: a config that only includes the lab's (the way ~/.ssh/config
includes ~/.ssh/config.d/*) reaches both nodes, as `ssh -F` does with it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_config_that_includes_the_labs_reaches_every_node(clean_lab, tmp_path):
    config = tmp_path / "config"
    config.write_text(f"# the user's own config\nInclude {clean_lab.ssh_config}\n")
    ssh = subprocess.run(["ssh", "-F", str(config), "worker1", "hostname"], capture_output=True, text=True, timeout=60)
    assert ssh.stdout.strip() == "worker1", ssh.stderr          # what ssh itself makes of it

    done = subprocess.run([sys.executable, "-m", "ddp_preflight", "master", "worker1", "--no-probes", "--json",
                           "--only", "node-reachable", "--ssh-config", str(config)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)

    assert done.returncode == 0, (done.stdout[-2000:], done.stderr)
    results = json.loads(done.stdout)["results"]
    assert [(r["node"], r["status"]) for r in results] == [("master", "pass"), ("worker1", "pass")]
