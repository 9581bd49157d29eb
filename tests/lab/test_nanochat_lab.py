"""nanochat's own documented command through preflight and --launch on the lab (issue 26): no
false failure (scripts/ without __init__.py is a namespace package Python imports), the process
group nanochat creates only under CUDA said before a CPU launch and failing it, its fix applied and
then a real 2x2 Gloo training that forms one group; and per-node data folders on the command line.

The project is tests/projects/nanochat (nanochat's real shape, see its README), copied into the
test's folder, which every lab node sees at the same path; its dependencies (wandb, yaml, ...) are
stood in by tests/projects/nanochat_deps on the training's PYTHONPATH."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Two launches, each after its preflight, on cores four sessions share: minutes, not seconds.
pytestmark = pytest.mark.timeout(900)

CLI = [sys.executable, "-m", "ddp_preflight"]
REPO = Path(__file__).parents[2]
PROJECTS = REPO / "tests" / "projects"
NODES = ("master", "worker1")
# nanochat's README: `torchrun --nproc_per_node=8 -m scripts.base_train -- ...`; its CPU example's options.
COMMAND = ("--", "-m", "scripts.base_train", "--", "--device-type=cpu", "--num-iterations=3")
# Gloo's own measured gaps (torch 2.13): kept with the passes when no code calls them
# (tests/lab/test_preflight_lab.py).
GLOO_GAPS = {"reduce_scatter_tensor", "reduce_scatter", "isend_irecv", "all_reduce_premul_sum", "all_gather_uneven"}
TIMED = {"bandwidth", "compute-balance"}
FIX = ('in nanochat/common.py, after line 57 (the end of that `if`), indented as it: if is_ddp_requested and not '
       'dist.is_initialized(): dist.init_process_group(backend="gloo")')
# Without --launch the same group is a warning: a GPU on some node may take the CUDA branch.
ALONE = ("the training code creates its process group only under CUDA (nanochat/common.py:54, inside "
         "`if is_ddp_requested and device_type == 'cuda':` at line 51): on this CPU run no rank joins a group "
         "and each trains alone")


def project(tmp_path: Path) -> tuple[Path, Path]:
    root, deps = tmp_path / "nanochat", tmp_path / "deps"
    shutil.copytree(PROJECTS / "nanochat", root, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(PROJECTS / "nanochat_deps", deps, ignore=shutil.ignore_patterns("__pycache__"))
    return root, deps


def run(lab, root: Path, *options: str, timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run([*CLI, *NODES, "--ssh-config", str(lab.ssh_config), *options, *COMMAND],
                          capture_output=True, text=True, timeout=timeout, cwd=root)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done


def table(text: str) -> set:
    """(check, node, status) of each row of the text report (passes are hidden)."""
    cells = [[c.strip() for c in line.split("\u2502")[1:-1]] for line in text.splitlines() if line.count("\u2502") > 4]
    return {(c[0], c[1], c[2]) for c in cells if c[0]}


def findings(report: dict) -> set:
    """(check, node, status) of every result that is not a pass or a skip, but for the timed
    checks: on this box's shared cores their figures (a straggler, a slow link) follow the load."""
    return {(r["check"], r["node"], r["status"]) for r in report["results"]
            if r["status"] not in ("pass", "skip") and r["check"] not in TIMED}


def test_nanochats_command_has_no_false_failure_and_names_what_a_node_lacks(clean_lab, tmp_path):
    root, deps = project(tmp_path)

    done = run(clean_lab, root, "--json", "--env", f"PYTHONPATH={deps}")
    report = json.loads(done.stdout)

    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-2000:])
    imports = [r for r in report["results"] if r["check"] == "training-imports"]
    assert [(r["node"], r["status"]) for r in imports] == [("master", "pass"), ("worker1", "pass")]
    assert imports[1]["details"]["own"] == {"scripts": "scripts/", "nanochat": "nanochat/__init__.py"}
    assert imports[1]["details"]["pythonpath"] == {m: f"{deps}/{m}/__init__.py" for m in
                                                   ("wandb", "rustbpe", "tiktoken", "yaml", "requests")}
    # The training command is scanned without --launch too: nanochat's real CPU shape (its group
    # only under CUDA) is said, as a warning, on no node in particular; nothing else is found.
    assert findings(report) == {("collectives", None, "warn")}
    (alone,) = [r for r in report["results"] if r["check"] == "collectives" and r["status"] == "warn"]
    assert (alone["summary"], alone["fix"]) == (ALONE, FIX)
    assert {r["details"]["op"] for r in report["results"] if "workaround" in r["details"]} == GLOO_GAPS

    # Its dependencies on the master's PYTHONPATH only: worker1 is named, with what it lacks and
    # the interpreter that lacks it.
    done = run(clean_lab, root, "--json", "--only", "training-imports", "--env", f"master:PYTHONPATH={deps}")
    report = json.loads(done.stdout)
    assert done.returncode == 1
    assert findings(report) == {("training-imports", "worker1", "fail")}
    (bad,) = [r for r in report["results"] if r["status"] == "fail"]
    assert bad["details"]["cannot_import"] == ["wandb", "rustbpe", "tiktoken", "yaml", "requests"]
    assert bad["summary"].startswith(f"{sys.executable} on worker1 cannot import wandb (scripts/base_train.py:17)")
    assert bad["fix"] == (f"requests, rustbpe, tiktoken, wandb, yaml are found on master through the training's "
                          f"PYTHONPATH ({deps}): run on worker1: rsync -a master:{deps}/ {deps}/ and give worker1 "
                          f"the same PYTHONPATH (--env worker1:PYTHONPATH={deps})")


def test_a_cpu_launch_refuses_ranks_that_never_form_a_group_and_after_the_fix_they_train_together(
        clean_lab, tmp_path):
    root, deps = project(tmp_path)
    # The checks this run is about (two full preflights on this box's shared cores outlast the
    # test's bound): the collectives probe is where the code is scanned.
    options = ("--launch", "--nproc-per-node", "2", "--log-dir", str(tmp_path / "run"), "--env", f"PYTHONPATH={deps}",
               "--only", "node-reachable,training-imports,launch-args,code-parity,collectives")

    refused = run(clean_lab, root, *options)

    assert refused.returncode == 1, (refused.stdout[-3000:], refused.stderr[-2000:])
    assert "[master r0]" not in refused.stdout             # no rank started
    assert "ddp-preflight: not launching: collectives failed: the training code creates its process group only " \
           "under CUDA (nanochat/common.py:54" in refused.stderr
    assert f"1. {FIX}" in refused.stdout
    # The only failure; the scan of the code under --launch also settles Gloo's gaps (the code
    # calls none of them), which a preflight without it warns about.
    assert {row for row in table(refused.stdout) if row[2] in ("warn", "fail", "error") and row[0] not in TIMED} \
        == {("collectives", "-", "fail")}, refused.stdout

    # The fix, as printed: after line 57 (the `if` and its else), indented as the `if`.
    common = root / "nanochat" / "common.py"
    lines = common.read_text().splitlines(keepends=True)
    assert lines[56].strip() == "device = torch.device(device_type)  # mps|cpu"
    lines.insert(57, "    " + FIX.split("indented as it: ")[1] + "\n")
    common.write_text("".join(lines))

    done = run(clean_lab, root, *options)

    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    ends = {line.split("] ", 1)[0] + "]": line.split("] ", 1)[1] for line in done.stdout.splitlines()
            if "in a group of" in line}
    assert sorted(ends) == ["[master r0]", "[master r1]", "[worker1 r2]", "[worker1 r3]"]
    # One group of 4, the gradients averaged: every rank ends with the same weights.
    assert {text.split(", weights ")[0].split(": ", 1)[1] for text in ends.values()} == {"step 3 in a group of 4"}
    assert len({text.split(", weights ")[1] for text in ends.values()}) == 1


def test_each_nodes_own_data_folder_from_the_command_line(clean_lab, tmp_path):
    # The master's own folder holds the lab's shards (each node mounts its copy at data_dir);
    # worker1's is another folder, one shard short.
    shards = Path(clean_lab.state.data_dir)
    own = tmp_path / "w1-data"
    shutil.copytree(clean_lab.state.path / "dataset", own)
    dropped = sorted(p.name for p in own.iterdir() if p.is_file())[-1]
    (own / dropped).unlink()

    done = subprocess.run([*CLI, *NODES, "--ssh-config", str(clean_lab.ssh_config), "--json", "--only",
                           "data-shards", "--data-dir", str(shards), "--data-dir", f"worker1:{own}"],
                          capture_output=True, text=True, timeout=300)
    report = json.loads(done.stdout)

    assert done.returncode == 1, (done.stdout[-3000:], done.stderr[-2000:])
    assert {(r["check"], r["node"], r["status"]) for r in report["results"]} == \
        {("data-shards", "master", "pass"), ("data-shards", "worker1", "fail")}
    (bad,) = [r for r in report["results"] if r["status"] == "fail"]
    assert bad["details"]["data_dir"] == str(own) and bad["details"]["missing"] == [dropped]
    # Into worker1's own folder, from the master's.
    assert bad["fix"].startswith("run on worker1: rsync -a --delete ") and bad["fix"].endswith(f":{shards}/ {own}/")
