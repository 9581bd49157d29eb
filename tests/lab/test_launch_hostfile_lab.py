"""A DeepSpeed hostfile with different slots per host, launched as DeepSpeed would run it: each
node its own ranks, numbered node after node, all of them watched and accounted for (issue 39)."""

from __future__ import annotations

import json
import subprocess

from .test_launch_lab import CLI, REPO, TRAIN, assert_nothing_left, counts, said


def test_a_hostfile_of_two_slots_and_one_launches_three_ranks_numbered_node_after_node(clean_lab, tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("master slots=2\nworker1 slots=1   # a smaller machine\n")
    before = counts(clean_lab)
    done = subprocess.run([*CLI, "--hostfile", str(hostfile), "--ssh-config", str(clean_lab.ssh_config), "--launch",
                           "--no-probes", "--log-dir", str(tmp_path / "run"), "--", str(TRAIN), "--steps", "3"],
                          capture_output=True, text=True, timeout=180, cwd=REPO)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 0, said(done)
    assert " on 2+1 = 3 ranks; " in done.stderr, said(done)
    for rank, node in ((0, "master"), (1, "master"), (2, "worker1")):
        # torchrun's own numbering (its agents add up each node's ranks) is the one the launch shows.
        assert f"[{node} r{rank}] rank {rank} of 3 on {node}" in done.stdout, done.stdout[-3000:]
        assert f"[{node} r{rank}] step 2 loss" in done.stdout
    assert "[worker1 r3]" not in done.stdout and "[master r2]" not in done.stdout
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert plan["world_size"] == 3 and [n["ranks"] for n in plan["nodes"]] == [[0, 1], [2]]
    assert [n["torchrun"][n["torchrun"].index("--nproc-per-node") + 1] for n in plan["nodes"]] == ["2", "1"]
    assert "all 3 ranks exited with code 0" in done.stderr, said(done)
    assert json.loads((tmp_path / "run" / "result.json").read_text())["ok"] is True
    assert_nothing_left(clean_lab, before)


def test_the_probes_of_a_hostfile_with_two_slots_and_one_run_each_nodes_own_ranks(clean_lab, tmp_path):
    # The collectives run 2 + 1 ranks, as training will (they ran the fewest any node has: 1 + 1,
    # which never tried the master's two ranks between themselves); bandwidth rides on the same
    # job with one rank per node.
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("master slots=2\nworker1 slots=1\n")
    before = counts(clean_lab)
    done = subprocess.run([*CLI, "--hostfile", str(hostfile), "--ssh-config", str(clean_lab.ssh_config),
                           "--only", "collectives,bandwidth", "--json", "--", str(TRAIN)],
                          capture_output=True, text=True, timeout=240, cwd=REPO)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 0, said(done)
    results = json.loads(done.stdout)["results"]
    collectives = {(r["details"]["world"], tuple(r["details"]["nodes"])) for r in results if r["check"] == "collectives"}
    assert collectives == {(3, ("master", "worker1"))}, results
    [bandwidth] = [r for r in results if r["check"] == "bandwidth"]
    assert (bandwidth["status"], bandwidth["details"]["world_size"]) == ("pass", 2), bandwidth
    assert_nothing_left(clean_lab, before)
