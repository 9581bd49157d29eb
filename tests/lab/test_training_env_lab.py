"""Per-node settings on the lab, end to end: each node's training variables (the config's
[env] and [nodes.NAME.env], --env NODE:NAME=VALUE) reach that node's ranks through a real
--launch; and training-imports names the module one node's code folder lacks, on that node."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

CLI = [sys.executable, "-m", "ddp_preflight"]
NODES = ("master", "worker1")

SHOW_ENV = """\
import datetime
import os
import socket

import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
print(f"rank {dist.get_rank()} on {socket.gethostname()}: SOME_VAR={os.environ.get('SOME_VAR')} "
      f"EVERY_VAR={os.environ.get('EVERY_VAR')}", flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def test_each_nodes_own_variables_reach_its_ranks_through_a_real_launch(clean_lab, tmp_path):
    script = tmp_path / "show_env.py"
    script.write_text(SHOW_ENV)
    config = tmp_path / "cluster.toml"
    config.write_text('[env]\nEVERY_VAR = "everyone"\nSOME_VAR = "from-env-table"\n'
                      '[nodes.master.env]\nSOME_VAR = "m"\n')
    done = subprocess.run([*CLI, *NODES, "--ssh-config", str(clean_lab.ssh_config), "--config", str(config),
                           "--launch", "--no-probes", "--nproc-per-node", "2", "--log-dir", str(tmp_path / "run"),
                           "--env", "worker1:SOME_VAR=x", "--env", "worker1:NCCL_DEBUG=WARN", "--", str(script)],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])

    said = sorted(line for line in done.stdout.splitlines() if "SOME_VAR=" in line)
    assert said == ["[master r0] rank 0 on master: SOME_VAR=m EVERY_VAR=everyone",
                    "[master r1] rank 1 on master: SOME_VAR=m EVERY_VAR=everyone",
                    "[worker1 r2] rank 2 on worker1: SOME_VAR=x EVERY_VAR=everyone",
                    "[worker1 r3] rank 3 on worker1: SOME_VAR=x EVERY_VAR=everyone"]
    plan = {n["node"]: n for n in json.loads((tmp_path / "run" / "plan.json").read_text())["nodes"]}
    # A name not known to be safe is shown <redacted> (docs/security.md: environments by
    # allow-list); where each value came from is kept, and a known-safe setting is shown as given.
    assert {n: (p["env"]["SOME_VAR"], p["env_sources"]["SOME_VAR"]) for n, p in plan.items()} == \
        {"master": ("<redacted>", "config [nodes.master.env]"), "worker1": ("<redacted>", "--env worker1:")}
    assert (plan["worker1"]["env"]["NCCL_DEBUG"], plan["worker1"]["env_sources"]["NCCL_DEBUG"]) == ("WARN", "--env worker1:")
    assert plan["worker1"]["env_sources"]["EVERY_VAR"] == "config [env]"


def test_training_imports_names_the_module_only_the_masters_code_folder_has(clean_lab, tmp_path):
    train = "import torch\nimport onlyhere\nprint(onlyhere.WHERE)\n"
    master, worker = tmp_path / "master-code", tmp_path / "worker1-code"
    for folder in (master, worker):
        folder.mkdir()
        (folder / "train.py").write_text(train)
    (master / "onlyhere.py").write_text("WHERE = 'master'\n")
    config = tmp_path / "cluster.toml"
    config.write_text(textwrap.dedent(f"""\
        code_dir = "{master}"
        [nodes.worker1]
        code_dir = "{worker}"
        """))

    done = subprocess.run([*CLI, *NODES, "--ssh-config", str(clean_lab.ssh_config), "--config", str(config),
                           "--python", sys.executable, "--only", "training-imports", "--json", "--", "train.py"],
                          capture_output=True, text=True, timeout=180, cwd=master)
    assert done.returncode == 1, done.stderr[-3000:]
    results = {r["node"]: r for r in json.loads(done.stdout)["results"]}
    assert set(results) == set(NODES)
    assert results["master"]["status"] == "pass"
    assert results["master"]["details"]["own"] == {"onlyhere": "onlyhere.py"}
    bad = results["worker1"]
    assert (bad["status"], bad["summary"]) == ("fail", f"{sys.executable} on worker1 cannot import onlyhere (train.py:2)")
    assert bad["fix"] == (f"onlyhere is the project's own (onlyhere.py on master): copy the training code to "
                          f"worker1: run on worker1: rsync -a master:{master}/ {worker}/")
    assert bad["details"]["entry"] == str(worker / "train.py")
