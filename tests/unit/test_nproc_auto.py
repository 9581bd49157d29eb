"""--nproc-per-node auto: settled from the nodes' recorded facts as torchrun settles it (GPUs on a
CUDA run, CPUs on a CPU run), the same on every node or one line naming the nodes; and through
the real command on this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_preflight.preflight.nproc_auto import NprocError, settle

from .facts_fixtures import clean, context, facts

ROOT = Path(__file__).resolve().parents[2]


def test_a_cpu_run_gets_each_nodes_cpus_when_they_agree():
    art = clean()
    cores = {facts(art, n["node"])["cpu"]["logical_cores"] for n in art["nodes"]}
    assert len(cores) == 1

    assert settle(context(art).nodes, "cpu") == cores.pop()


def test_nodes_with_different_cpus_are_named_with_the_fix():
    art = clean()
    facts(art, "worker1")["cpu"]["logical_cores"] = 64          # EDIT: a bigger worker

    with pytest.raises(NprocError) as said:
        settle(context(art).nodes, "cpu")

    master = facts(art, "master")["cpu"]["logical_cores"]
    assert str(said.value) == (f"--nproc-per-node auto: the nodes have different numbers of CPUs (master {master}, "
                               f"worker1 64) and ddp-preflight starts as many ranks on each: give --nproc-per-node N "
                               f"(at most {master})")


def test_a_cuda_run_without_gpus_cannot_be_auto():
    with pytest.raises(NprocError) as said:
        settle(context(clean()).nodes, "cuda")
    assert str(said.value) == "--nproc-per-node auto: master, worker1 show no GPUs to count: give --nproc-per-node N"


def test_the_command_settles_auto_to_this_machines_cpus():
    done = subprocess.run([sys.executable, "-m", "ddp_preflight", "--nproc-per-node", "auto", "--only", "ranks-per-node",
                           "--no-probes", "--json"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    (result,) = json.loads(done.stdout)["results"]
    assert result["details"]["nproc_per_node"] == os.cpu_count()
