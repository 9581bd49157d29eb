"""training-imports: the training command's imports found with ast and resolved by the training
Python from where the launch starts (node/facts/imports.py, a real child Python over real small
projects), and the check over what two such "nodes" reported."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ddp_preflight.node.facts.imports import training_imports
from ddp_preflight.preflight.checks import BY_ID, run_checks
from ddp_preflight.preflight.model import Context, NodeFacts, Options, Status

REPO = Path(__file__).parents[2]
PYTHON = sys.executable


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def collect(args: list[str], cwd: Path, code_dir: Path | None = None, master_code: Path | None = None) -> dict:
    """The imports section as the collector sends it, for a command run from `cwd` on the master."""
    return training_imports({"launch_args": args, "launch_cwd": str(cwd), "code_dir": str(code_dir or cwd),
                             "master_code_dir": str(master_code or cwd)})


TRAIN = """\
    import os
    import json as _json
    from typing import TYPE_CHECKING
    import torch
    import mylocal
    from pkg import helper
    try:
        import optional_nosuch
    except ImportError:
        optional_nosuch = None
    try:
        import also_optional_nosuch
    except (ModuleNotFoundError, OSError):
        pass
    if TYPE_CHECKING:
        import typing_only_nosuch
    def later():
        import lazy_nosuch
    class Config:
        import classbody_nosuch
    open(os.path.join(os.path.dirname(__file__), "RAN"), "w").write("the scan ran the script")
"""
PROJECT = {
    "train.py": TRAIN,
    "mylocal.py": "import wandb_nosuch\n",
    "pkg/__init__.py": "open(__file__ + '.RAN', 'w')\n",
    "pkg/helper.py": "from . import sub\nimport yaml\n",
    "pkg/sub.py": "from .deeper import thing\n",
    "pkg/deeper.py": "import deep_nosuch\n",
}


def test_a_scripts_imports_and_its_own_modules_are_resolved_without_running_any_of_them(tmp_path):
    root = write(tmp_path / "proj", PROJECT)

    found = collect(["train.py", "--depth", "4"], root)

    assert found["python"] == PYTHON and found["entry"] == str(root / "train.py") and found["module"] is False
    assert found["files"] == ["train.py", "mylocal.py", "pkg/__init__.py", "pkg/helper.py", "pkg/sub.py",
                              "pkg/deeper.py"]
    # Module level and class bodies run at import; a function's imports and TYPE_CHECKING's do not.
    assert found["missing"] == [{"module": "classbody_nosuch", "file": "train.py", "line": 20},
                                {"module": "wandb_nosuch", "file": "mylocal.py", "line": 1},
                                {"module": "yaml", "file": "pkg/helper.py", "line": 2},
                                {"module": "deep_nosuch", "file": "pkg/deeper.py", "line": 1}]
    assert found["optional_missing"] == [{"module": "optional_nosuch", "file": "train.py", "line": 8},
                                         {"module": "also_optional_nosuch", "file": "train.py", "line": 12}]
    assert found["own"] == {"mylocal": "mylocal.py", "pkg": "pkg/__init__.py"}
    assert found["external"] == ["torch"] and found["torch"] is True
    assert not list(root.rglob("*RAN"))           # neither the script nor the package's __init__ ran


def test_a_module_command_resolves_from_the_start_folder_with_its_packages_first(tmp_path):
    root = write(tmp_path / "nanochat", {
        "scripts/__init__.py": "",
        "scripts/base_train.py": "import torch\nfrom nanochat.common import compute_init\nimport wandb_nosuch\n",
        "nanochat/__init__.py": "",
        "nanochat/common.py": "import filelock_nosuch\nimport torch.distributed as dist\n",
    })

    found = collect(["-m", "scripts.base_train", "--", "--run=d8"], root)

    assert (found["entry"], found["module"], found["root"]) == ("scripts.base_train", True, str(root))
    assert found["files"] == ["scripts/__init__.py", "scripts/base_train.py", "nanochat/__init__.py",
                              "nanochat/common.py"]
    assert [m["module"] for m in found["missing"]] == ["wandb_nosuch", "filelock_nosuch"]


def test_a_node_with_its_own_code_folder_is_scanned_there(tmp_path):
    master = write(tmp_path / "master", {"train.py": "import here_only\n", "here_only.py": ""})
    worker = write(tmp_path / "worker", {"train.py": "import here_only\n"})

    assert collect(["train.py"], master)["missing"] == []
    found = collect(["train.py"], master, code_dir=worker, master_code=master)
    assert found["entry"] == str(worker / "train.py")
    assert found["missing"] == [{"module": "here_only", "file": "train.py", "line": 1}]


@pytest.mark.parametrize("args, error", [
    (["nowhere.py"], "the script {root}/nowhere.py does not exist here"),
    (["-m", "nosuch.train"], "no module named 'nosuch' from {root}"),
])
def test_an_entry_that_is_not_there_is_said(tmp_path, args, error):
    found = collect(args, tmp_path)
    assert found["entry_error"] == error.format(root=tmp_path)


@pytest.mark.parametrize("args, fix", [
    (["nowhere.py"], "correct the training command's script name, or run ddp-preflight from the folder "
                     "that holds it, or give that folder: --code-dir PATH"),
    (["-m", "nosuch.train"], "correct the training command's module name, or run ddp-preflight from the "
                             "folder that holds it, or give that folder: --code-dir PATH"),
])
def test_an_entry_missing_on_the_master_itself_is_the_commands_never_a_copy_to_make(tmp_path, args, fix):
    # The master is where the code is read from: no node to copy it from, no "same path" to copy to.
    result = run(("master", collect(args, tmp_path)), launch_args=args)["master"]
    assert (result.status, result.summary) == (Status.FAIL, "master: " + collect(args, tmp_path)["entry_error"])
    assert result.fix == fix


def test_torchruns_own_options_before_the_script_are_not_taken_for_it(tmp_path):
    root = write(tmp_path, {"train.py": "import os\n"})
    found = collect(["--standalone", "train.py", "--x"], root)
    assert found["entry"] == str(root / "train.py") and found["missing"] == []


# --- the check, over what two nodes' collectors reported -----------------------------------------

def run(*nodes: tuple[str, dict], launch_args=("train.py",), **options):
    ctx = Context(tuple(NodeFacts(name, {"imports": section}) for name, section in nodes),
                  Options(launch_args=tuple(launch_args), **options))
    results = run_checks(ctx, [BY_ID["training-imports"]])
    for result in results:
        json.dumps(result.to_json())
    return {r.node: r for r in results}


def test_the_node_that_lacks_a_module_is_named_with_the_module_the_file_and_the_fix(tmp_path):
    master = write(tmp_path / "master", {"train.py": "import torch\nimport mylocal\nimport json\n",
                                         "mylocal.py": "import os\n"})
    worker = write(tmp_path / "worker", {"train.py": "import torch\nimport mylocal\nimport json\n"})
    worker_scan = collect(["train.py"], master, code_dir=worker, master_code=master)
    worker_scan["missing"].append({"module": "wandb", "file": "train.py", "line": 4})   # EDIT: not installed there

    results = run(("master", collect(["train.py"], master)), ("worker1", worker_scan),
                  pythons={"master": PYTHON, "worker1": PYTHON})

    assert results["master"].status is Status.PASS
    assert results["master"].summary == (f"{PYTHON} has torch and finds all 1 installed and 1 own top-level "
                                         "modules of " + str(master / "train.py") + " (2 files read)")
    bad = results["worker1"]
    assert bad.status is Status.FAIL
    assert bad.summary == f"{PYTHON} on worker1 cannot import mylocal (train.py:2), wandb (train.py:4)"
    assert bad.fix == (f"worker1: {PYTHON} -m pip install wandb; mylocal is the project's own (mylocal.py on "
                       f"master): copy the training code to worker1: run on worker1: rsync -a master:{master}/ "
                       f"{worker}/")
    assert bad.details["cannot_import"] == ["mylocal", "wandb"]


def test_without_python_named_the_fix_offers_python_too_and_a_python_without_torch_fails(tmp_path):
    root = write(tmp_path, {"train.py": "import os\n"})
    scan = collect(["train.py"], root)
    scan["torch"] = False                   # EDIT: this Python has no torch

    result = run(("master", scan))["master"]

    assert result.summary == f"{PYTHON} on master cannot import torch (torchrun runs in it)"
    assert result.fix == (f"master: {PYTHON} -m pip install torch; or --python master:PATH if {PYTHON} "
                          "(ddp-preflight's own) is not the training's")


def test_without_a_training_command_it_is_skipped_with_the_reason():
    assert [(r.status, r.summary) for r in run(("master", {}), launch_args=()).values()] == \
        [(Status.SKIP, "no training command given (put it after --): nothing to import")]


def test_the_cli_names_the_missing_module_on_this_machine(tmp_path):
    root = write(tmp_path, {"train.py": "import torch\nimport wandb_nosuch\n"})
    done = subprocess.run([PYTHON, "-m", "ddp_preflight", "--only", "training-imports", "--python", PYTHON, "--json",
                           "--", "train.py", "--steps", "3"], capture_output=True, text=True, timeout=120, cwd=root)
    (result,) = json.loads(done.stdout)["results"]
    assert done.returncode == 1
    assert result["summary"].endswith(f"{PYTHON} on {result['node']} cannot import wandb_nosuch (train.py:2)")
    assert result["fix"] == f"{result['node']}: {PYTHON} -m pip install wandb_nosuch"
