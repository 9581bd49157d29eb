"""`ddp-preflight explain` on what a real `--launch` left: the evidence is kept by default (every
rank's Flight Recorder when the run is stopped, torchelastic's error file of a rank that raised),
with no change to the training script, and explain names the rank from it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from .test_launch_lab import REPO, assert_nothing_left, command, counts

HANG = REPO / "examples" / "hang_train.py"


def launched(lab, tmp_path, *script_args):
    argv = command(lab, tmp_path, "--no-probes", "--stop-on-hang")
    argv = argv[:argv.index("--") + 1] + [str(HANG), *script_args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 1, done.stderr[-3000:]
    return tmp_path / "run"


def explained(folder):
    run = subprocess.run([sys.executable, "-m", "ddp_preflight.cli.ddp_preflight", "explain", str(folder), "--json"],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert run.returncode == 1, run.stderr
    return json.loads(run.stdout)


def test_a_rank_that_leaves_the_loop_is_named_from_the_ranks_sequence_numbers(clean_lab, tmp_path):
    before = counts(clean_lab)
    folder = launched(clean_lab, tmp_path, "--steps", "500", "--fault", "leave", "--rank", "2", "--at", "6")
    assert sorted(p.name for p in folder.glob("flight-rank-*.json")) == [f"flight-rank-{r}.json" for r in range(4)]
    # The launch saved the run's verdict, the hang hangwatch named live (rank 2 idle at its own
    # line: it left the loop; nothing failed on its own before --stop-on-hang stopped every rank),
    # and explain of the folder reports that verdict (issue 24).
    saved = json.loads((folder / "result.json").read_text())["verdict"]
    data = explained(folder)
    d = data["diagnosis"]
    assert data["saved"] and (saved["kind"], saved["culprits"], saved["reason"]) == ("deadlock", [2], "left-loop")
    assert (d["kind"], d["culprits"], d["candidates"], d["reason"], d["certainty"]) == \
        ("deadlock", [2], [], "left-loop", "certain")
    # What the run's files alone say (its Flight Recorders, its bundle, its logs) names the same
    # rank, by the ranks' sequence numbers.
    files = shutil.copytree(folder, tmp_path / "files", ignore=shutil.ignore_patterns("result.json"))
    data = explained(files)
    d = data["diagnosis"]
    assert (d["kind"], d["culprits"], d["candidates"], d["reason"], d["certainty"]) == \
        ("deadlock", [2], [], "behind", "certain")
    seqs = {e["rank"]: e["seq"] for e in d["evidence"]}
    top = seqs[0]
    assert seqs == {0: top, 1: top, 2: top - 1, 3: top}
    assert d["summary"].startswith(f"rank 2 never entered all_reduce #{top} (its last: #{top - 1} all_reduce; it was "
                                   "at hang_train.py:"), d["summary"]
    assert ", which ranks 0,1,3 issued at hang_train.py:" in d["summary"], d["summary"]
    # The remedies of uneven data, from the one causes catalogue hangwatch uses too (a cause is data:
    # its words and its fixes).
    cause = json.dumps(d["causes"][0])
    assert all(w in cause for w in ("drop_last=True", "Join", "all_reduce per step", "equal shards"))
    assert [q["path"].rsplit("/", 1)[1] for q in data["quotes"]][:1] == ["flight-rank-2.json"]
    assert_nothing_left(clean_lab, before)


def test_a_rank_that_raises_leaves_its_error_file_in_the_log_folder(clean_lab, tmp_path):
    before = counts(clean_lab)
    folder = launched(clean_lab, tmp_path, "--steps", "60", "--fault", "raise", "--rank", "3", "--at", "5")
    error = json.loads((folder / "error-rank-3.json").read_text())
    assert (error["rank"], error["node"], error["message"]["message"]) == (3, "worker1", "RuntimeError: bad batch at step 5")
    assert "hang_train.py" in error["message"]["extraInfo"]["py_callstack"]
    d = explained(folder)["diagnosis"]
    assert (d["kind"], d["culprits"], d["reason"], d["certainty"]) == ("exited", [3], "raised", "certain")
    assert_nothing_left(clean_lab, before)


def test_a_launch_whose_node_never_started_is_that_node_not_no_failure(clean_lab, tmp_path):
    # Issue 26: explain said "no failure found" (exit 0) of a launch whose node failed to start.
    # worker1's Python has no torch; --force launches anyway: its torchrun cannot start there.
    bare = shutil.which("python3", path="/usr/bin:/usr/local/bin")
    assert subprocess.run([bare, "-c", "import torch"], capture_output=True).returncode != 0, bare
    config = tmp_path / "cluster.toml"
    config.write_text(f'[nodes.worker1]\npython = "{bare}"\n')
    before = counts(clean_lab)
    argv = command(clean_lab, tmp_path, "--no-probes", "--force", "--config", str(config))
    argv = argv[:argv.index("--") + 1] + [str(HANG), "--steps", "50"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert "Traceback (most recent call last):\n  File \"/work" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 1, done.stderr[-3000:]
    folder = tmp_path / "run"
    nodes = {n["node"]: n for n in json.loads((folder / "result.json").read_text())["nodes"]}
    said = nodes["worker1"]["error"]
    assert said.startswith(f"torchrun is not importable with {bare}"), nodes
    data = explained(folder)
    finding = data["finding"]
    assert data["diagnosis"] is None and data["ok"] is False
    assert (finding["kind"], finding["cause"], finding["culprits"], finding["certainty"]) == \
        ("node-not-started", "node-error", [], "certain")
    assert finding["detail"] == {"nodes": {"worker1": said}}
    assert finding["fix"] == nodes["worker1"]["fix"], (finding["fix"], nodes["worker1"])
    text = subprocess.run([sys.executable, "-m", "ddp_preflight.cli.ddp_preflight", "explain", str(folder)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert text.returncode == 1 and text.stdout.startswith(
        f"node-not-started (certain): the launch did not start the training on worker1: {said} [node-error]"), text.stdout
    assert_nothing_left(clean_lab, before)
