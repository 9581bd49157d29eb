"""Under --launch the training command's code is scanned by default (issue 26): the files
training-imports followed on the master (the script and the project's own modules) are read as
--scan reads a folder, so nanochat's process group created only under CUDA is said before a CPU
launch, and fails it. On tests/projects/nanochat (nanochat's real shape) and the recorded 2-node
lab run of the collectives probe."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from ddp_preflight.cli.launch import refusal
from ddp_preflight.node.facts.imports import training_imports
from ddp_preflight.preflight.checks import BY_ID, run_checks
from ddp_preflight.preflight.model import Context, NodeFacts, Options, Report, Status
from ddp_preflight.preflight.probes.collectives import scan_project
from ddp_preflight.rules.facts import TrainingImports

REPO = Path(__file__).parents[2]
NANOCHAT = REPO / "tests" / "projects" / "nanochat"
ARTIFACT = Path(__file__).parent / "artifacts" / "collectives_gloo_2node.json"

SUMMARY = ("the training code creates its process group only under CUDA (nanochat/common.py:54, inside "
           "`if is_ddp_requested and device_type == 'cuda':` at line 51): on this CPU run no rank joins a group "
           "and each trains alone")
FIX = ('in nanochat/common.py, after line 57 (the end of that `if`), indented as it: if is_ddp_requested and not '
       'dist.is_initialized(): dist.init_process_group(backend="gloo")')


@pytest.fixture(scope="module")
def imports():
    return training_imports({"launch_args": ["-m", "scripts.base_train"], "launch_cwd": str(NANOCHAT)})


def test_the_project_the_command_imports_is_what_is_scanned(imports):
    found = scan_project(TrainingImports.from_json(imports))

    assert found is not None and found["path"] == str(NANOCHAT) and found["files"] == 8
    assert found["inits"] == [{"line": 54, "call": "dist.init_process_group", "cuda_only": True,
                               "guard": "is_ddp_requested and device_type == 'cuda'", "guard_line": 51,
                               "statement_end": 57, "column": 4, "otherwise": ["is_ddp_requested"], "file": "nanochat/common.py",
                               "text": 'dist.init_process_group(backend="nccl", device_id=device)'}]
    assert [(s["file"], s["line"], s["op"]) for s in found["sites"]] == \
        [("scripts/base_train.py", 39, "all_reduce_avg"), ("nanochat/common.py", 55, "barrier")]
    assert scan_project(TrainingImports("python")) is None       # no command: nothing to scan


def judged(imports, *, launch: bool, nproc: int = 1):
    art = copy.deepcopy(json.loads(ARTIFACT.read_text())["clean"])
    nodes = tuple(NodeFacts(n["node"], {**n["facts"], "imports": imports}, n["error"], n["fix"]) for n in art["nodes"])
    probes = art["probes"]
    probes["collectives"]["scan"] = scan_project(nodes[0].parsed.imports)
    ctx = Context(nodes, Options(master_addr=art["master_addr"], launch=launch, nproc_per_node=nproc), probes)
    return run_checks(ctx, [BY_ID["collectives"]])


def test_a_cpu_launch_of_ranks_that_never_form_a_group_fails_with_the_line_to_change(imports):
    results = judged(imports, launch=True, nproc=2)

    alone = [r for r in results if r.status is not Status.PASS]
    assert [(r.check, r.node, r.status) for r in alone] == [("collectives", None, Status.FAIL)]
    assert alone[0].summary == SUMMARY + "; all 4 ranks would train 4 separate models"
    assert alone[0].fix == FIX
    # The launch refuses on it (cli/launch.py), before any rank starts.
    assert refusal(Report(tuple(results)), False) == alone


def test_without_launch_the_same_code_is_a_warning(imports):
    results = judged(imports, launch=False)
    assert [(r.status, r.summary, r.fix) for r in results if r.status is not Status.PASS] == \
        [(Status.WARN, SUMMARY, FIX)]


def test_the_patched_project_forms_its_group_and_nothing_is_said(imports, tmp_path):
    # The fix applied as printed: after line 57, indented as the `if`.
    copy_root = tmp_path / "nanochat"
    for f in NANOCHAT.rglob("*.py"):
        (copy_root / f.relative_to(NANOCHAT)).parent.mkdir(parents=True, exist_ok=True)
        (copy_root / f.relative_to(NANOCHAT)).write_text(f.read_text())
    common = copy_root / "nanochat" / "common.py"
    lines = common.read_text().splitlines(keepends=True)
    lines.insert(57, "    " + FIX.split("indented as it: ")[1].split("   #")[0] + "\n")
    common.write_text("".join(lines))
    patched = training_imports({"launch_args": ["-m", "scripts.base_train"], "launch_cwd": str(copy_root)})

    results = judged(patched, launch=True, nproc=2)

    assert [r for r in results if r.status is not Status.PASS] == []


def test_without_launch_a_future_on_a_gloo_reduce_scatter_in_the_commands_code_fails_with_its_line(tmp_path):
    # Issue 38: nanochat's optimizer asks Gloo's reduce_scatter for its future (`.get_future()`),
    # which Gloo lacks; a plain preflight with the command after `--` said OK (the code was read only
    # with --scan or --launch). Its shape, in a project of its own; the recorded 2-node matrix.
    (tmp_path / "train.py").write_text(
        "import torch\nimport torch.distributed as dist\n\n\n"
        "def step(grad, out):\n"
        "    future = dist.reduce_scatter_tensor(out, grad, op=dist.ReduceOp.AVG, async_op=True).get_future()\n"
        "    return future.wait()\n")
    imports = training_imports({"launch_args": ["train.py"], "launch_cwd": str(tmp_path)})
    failed = [r for r in judged(imports, launch=False) if r.status is Status.FAIL]
    assert [(r.check, r.node) for r in failed] == [("collectives", None)], failed
    assert failed[0].summary.startswith("reduce_scatter_tensor(..., async_op=True).get_future() fails on gloo")
    assert failed[0].summary.endswith("; the training code calls it at train.py:6"), failed[0].summary
    assert failed[0].fix is not None and failed[0].fix.startswith(
        "call it as _async_op(dist.reduce_scatter_tensor(..., async_op=True))")
