"""Per-node data and code folders on the command line (issue 26): `--data-dir NODE:PATH` and
`--code-dir NODE:PATH` beside the form for every node, as the config's [nodes.NAME]; each node's
shards compared from its own folder, and every fix copies into the node's own path."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from ddp_preflight.preflight.checks import BY_ID, run_checks
from ddp_preflight.preflight.hosts import HostListError, NodePaths, node_paths
from ddp_preflight.preflight.model import Status

from . import facts_fixtures as ff
from .facts_fixtures import clean, context, one

PYTHON = sys.executable
HOSTS = ["master", "worker1", "fe80::1"]


def test_a_folder_for_every_node_and_one_nodes_own():
    given = node_paths("--data-dir", ["/data/full", "worker1:/scratch/w1", "fe80::1:/x:y"], HOSTS)

    assert given == NodePaths("/data/full", {"worker1": "/scratch/w1", "fe80::1": "/x:y"})
    assert (given.of("master"), given.of("worker1")) == ("/data/full", "/scratch/w1")
    assert node_paths("--code-dir", ["worker1:/srv/code"], HOSTS) == NodePaths(None, {"worker1": "/srv/code"})
    assert node_paths("--data-dir", ["./rel:ative"], HOSTS) == NodePaths("./rel:ative", {})


@pytest.mark.parametrize("values, error", [
    (["worker9:/data"], "--data-dir worker9:/data: worker9 is not one of the hosts (master, worker1, fe80::1): "
                        "write --data-dir NODE:PATH with a host of this run, or --data-dir PATH for every node"),
    (["/a", "/b"], "--data-dir names two folders for every node (/a, /b): give one, and --data-dir NODE:PATH "
                   "for a node whose folder differs"),
    (["worker1:/a", "worker1:/b"], "--data-dir names two folders for worker1 (/a, /b): give one"),
    (["worker1:"], "--data-dir worker1:: no folder after 'worker1:': write --data-dir worker1:PATH"),
])
def test_a_folder_for_a_node_that_is_not_a_host_is_refused(values, error):
    with pytest.raises(HostListError) as caught:
        node_paths("--data-dir", values, HOSTS)
    assert str(caught.value) == error


def test_the_cli_collects_shards_from_the_nodes_own_folder(tmp_path):
    here = socket.gethostname()
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "shard_00000.parquet").write_bytes(b"x" * 1000)
    done = subprocess.run([PYTHON, "-m", "ddp_preflight", "--only", "data-shards", "--json",
                           "--data-dir", f"{here}:{tmp_path / 'shards'}"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    (result,) = json.loads(done.stdout)["results"]
    assert (done.returncode, result["check"], result["node"], result["status"]) == (0, "data-shards", here, "pass")
    assert result["summary"] == "1 shards, 1.0 kB (the reference for the other nodes)"
    assert result["details"]["data_dir"] == str(tmp_path / "shards")


def test_the_cli_refuses_a_node_of_no_host_before_contacting_any(tmp_path):
    done = subprocess.run([PYTHON, "-m", "ddp_preflight", "--code-dir", "worker9:/srv/code"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"ddp-preflight: error: --code-dir worker9:/srv/code: worker9 is not one of the "
                                   f"hosts ({socket.gethostname()}): write --code-dir NODE:PATH with a host of this "
                                   "run, or --code-dir PATH for every node")


def test_code_parity_copies_into_the_nodes_own_folder():
    worker = {**ff.tree_code("2222"), "dir": "/srv/w1/nanochat"}
    art = ff.with_code(clean(), master=ff.tree_code("1111"), worker1=worker)

    results = run_checks(context(art), [BY_ID["code-parity"]])

    assert {(r.check, r.node, r.status) for r in results} == {("code-parity", "master", Status.PASS),
                                                              ("code-parity", "worker1", Status.FAIL)}
    # Before: rsync into /home/me/nanochat/ on worker1, a folder its launch never starts in.
    assert one(results, "code-parity", "worker1").fix == \
        "ssh worker1 'rsync -a --delete 10.213.0.200:/home/me/nanochat/ /srv/w1/nanochat/'"


def test_a_worker_without_the_script_gets_the_masters_code_copied_into_its_own_folder(tmp_path):
    from ddp_preflight.node.facts.imports import training_imports
    from ddp_preflight.preflight.model import Context, NodeFacts, Options

    master, worker = tmp_path / "master", tmp_path / "w1"
    master.mkdir()
    worker.mkdir()
    (master / "train.py").write_text("import os\n")

    def collect(code_dir):
        return training_imports({"launch_args": ["train.py"], "launch_cwd": str(master), "code_dir": str(code_dir),
                                 "master_code_dir": str(master)})

    ctx = Context((NodeFacts("master", {"imports": collect(master)}), NodeFacts("worker1", {"imports": collect(worker)})),
                  Options(launch_args=("train.py",), pythons={"master": PYTHON, "worker1": PYTHON}))
    results = run_checks(ctx, [BY_ID["training-imports"]])

    assert {(r.check, r.node, r.status) for r in results} == {("training-imports", "master", Status.PASS),
                                                              ("training-imports", "worker1", Status.FAIL)}
    bad = one(results, "training-imports", "worker1")
    assert bad.summary == f"worker1: the script {worker}/train.py does not exist here"
    assert bad.fix == (f"copy the training code to worker1: run on worker1: rsync -a master:{master}/ {worker}/; "
                       "or give worker1's own folder: --code-dir worker1:PATH")
