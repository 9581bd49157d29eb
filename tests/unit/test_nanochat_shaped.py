"""nanochat's own command through training-imports (issue 26): `-m scripts.base_train` where
scripts/ has no __init__.py (a namespace package Python imports), the project's own modules
followed, PYTHONPATH per node. On tests/projects/nanochat, a small copy of nanochat's real
shape (its README says from which commit), scanned by a real child Python."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_preflight.node.facts.imports import training_imports
from ddp_preflight.preflight.checks import BY_ID, run_checks
from ddp_preflight.preflight.model import Context, NodeFacts, Options, Status

REPO = Path(__file__).parents[2]
NANOCHAT = REPO / "tests" / "projects" / "nanochat"
DEPS = REPO / "tests" / "projects" / "nanochat_deps"
PYTHON = sys.executable

# Everything scripts/base_train.py reaches, in the order the scan reads it (breadth first).
FILES = ["scripts/base_train.py", "nanochat/__init__.py", "nanochat/common.py", "nanochat/dataloader.py",
         "nanochat/gpt.py", "nanochat/tokenizer.py", "scripts/base_eval.py", "nanochat/dataset.py"]
# What this project's environment lacks of nanochat's dependencies (filelock comes with torch,
# pyarrow is the project's own dependency): the nanochat/* ones are found only by following them.
MISSING = [{"module": "wandb", "file": "scripts/base_train.py", "line": 17},
           {"module": "rustbpe", "file": "nanochat/tokenizer.py", "line": 5},
           {"module": "tiktoken", "file": "nanochat/tokenizer.py", "line": 6},
           {"module": "yaml", "file": "scripts/base_eval.py", "line": 5},
           {"module": "requests", "file": "nanochat/dataset.py", "line": 8}]


def collect(args: list[str], cwd: Path = NANOCHAT) -> dict:
    return training_imports({"launch_args": args, "launch_cwd": str(cwd), "code_dir": str(cwd),
                             "master_code_dir": str(cwd)})


def test_the_environment_has_what_the_expected_answer_assumes():
    import importlib.util
    assert [m for m in ("filelock", "pyarrow", "torch") if importlib.util.find_spec(m) is None] == []
    assert [m["module"] for m in MISSING if importlib.util.find_spec(m["module"]) is not None] == []
    assert not (NANOCHAT / "scripts" / "__init__.py").exists()


@pytest.mark.parametrize("args", [
    ["-m", "scripts.base_train"],                                           # python -m scripts.base_train
    ["--standalone", "--nproc_per_node=8", "-m", "scripts.base_train", "--", "--depth=4"],   # its README's torchrun
])
def test_a_namespace_package_run_with_minus_m_is_found_and_its_project_followed(monkeypatch, args):
    monkeypatch.delenv("PYTHONPATH", raising=False)

    found = collect(args)

    assert "entry_error" not in found            # before: "no module named 'scripts'" on every node
    assert (found["entry"], found["module"], found["root"]) == ("scripts.base_train", True, str(NANOCHAT))
    assert found["files"] == FILES
    assert found["missing"] == MISSING
    assert found["own"] == {"scripts": "scripts/", "nanochat": "nanochat/__init__.py"}
    assert found["external"] == ["torch", "filelock", "pyarrow"]


def test_the_script_form_follows_the_project_found_through_pythonpath(monkeypatch):
    # `PYTHONPATH=. python scripts/base_train.py`: scripts/ is first on sys.path, nanochat/ and
    # scripts.base_eval come from PYTHONPATH; before, nanochat/* was not followed (2 of 5 named).
    monkeypatch.setenv("PYTHONPATH", str(NANOCHAT))

    found = collect(["scripts/base_train.py"])

    assert found["root"] == str(NANOCHAT / "scripts") and found["module"] is False
    assert found["files"] == ["base_train.py"] + [f"{NANOCHAT}/{f}" for f in FILES[1:6]] + \
        ["base_eval.py", f"{NANOCHAT}/nanochat/dataset.py"]
    assert [(m["module"], m["line"]) for m in found["missing"]] == [(m["module"], m["line"]) for m in MISSING]


def test_without_pythonpath_the_script_form_misses_the_project_as_python_would(monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    found = collect(["scripts/base_train.py"])
    assert [m["module"] for m in found["missing"]] == ["wandb", "nanochat.common", "nanochat.dataloader",
                                                       "nanochat.gpt", "nanochat.tokenizer", "scripts.base_eval"]


def test_with_its_dependencies_on_pythonpath_nothing_is_missing(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(DEPS))
    found = collect(["-m", "scripts.base_train"])
    assert found["missing"] == []
    # Folders on the training's PYTHONPATH are followed as the project's own: their imports run too.
    deps = [f"{DEPS}/{name}/__init__.py" for name in ("wandb", "rustbpe", "tiktoken", "yaml", "requests")]
    assert found["files"] == FILES[:1] + deps[:1] + FILES[1:] + deps[1:]
    assert found["own"] == {"scripts": "scripts/", "nanochat": "nanochat/__init__.py"}
    assert found["pythonpath"] == {m: f"{DEPS}/{m}/__init__.py" for m in ("wandb", "rustbpe", "tiktoken", "yaml",
                                                                         "requests")}


def run(*nodes: tuple[str, dict], launch_args=("-m", "scripts.base_train"), **options):
    ctx = Context(tuple(NodeFacts(name, {"imports": section}) for name, section in nodes),
                  Options(launch_args=tuple(launch_args), **options))
    results = run_checks(ctx, [BY_ID["training-imports"]])
    for result in results:
        json.dumps(result.to_json())
    return results


def test_pythonpath_per_node_names_the_node_that_lacks_them_with_its_interpreter(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(DEPS))
    master = collect(["-m", "scripts.base_train"])
    monkeypatch.delenv("PYTHONPATH")
    worker = collect(["-m", "scripts.base_train"])

    results = run(("master", master), ("worker1", worker), pythons={"master": PYTHON, "worker1": PYTHON})

    assert {(r.check, r.node, r.status) for r in results} == {("training-imports", "master", Status.PASS),
                                                              ("training-imports", "worker1", Status.FAIL)}
    bad = results[1]
    assert bad.summary == (f"{PYTHON} on worker1 cannot import wandb (scripts/base_train.py:17), rustbpe "
                           "(nanochat/tokenizer.py:5), tiktoken (nanochat/tokenizer.py:6), yaml "
                           "(scripts/base_eval.py:5), requests (nanochat/dataset.py:8)")
    # The master finds them through its PYTHONPATH, outside the project: that folder and the
    # variable are the fix, not a copy of the project nor a pip install of a stand-in.
    assert bad.fix == (f"requests, rustbpe, tiktoken, wandb, yaml are found on master through the training's "
                       f"PYTHONPATH ({DEPS}): run on worker1: rsync -a master:{DEPS}/ {DEPS}/ and give worker1 the "
                       f"same PYTHONPATH (--env worker1:PYTHONPATH={DEPS})")


def test_the_cli_on_nanochats_command_names_what_is_missing_not_scripts(tmp_path):
    done = subprocess.run([PYTHON, "-m", "ddp_preflight", "--only", "training-imports", "--python", PYTHON, "--json",
                           "--", "-m", "scripts.base_train", "--depth=4"],
                          capture_output=True, text=True, timeout=120, cwd=NANOCHAT,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    (result,) = json.loads(done.stdout)["results"]
    assert (done.returncode, result["status"]) == (1, "fail")
    assert result["details"]["cannot_import"] == ["wandb", "rustbpe", "tiktoken", "yaml", "requests"]
    assert result["fix"] == f"{result['node']}: {PYTHON} -m pip install pyyaml requests rustbpe tiktoken wandb"

    with_deps = subprocess.run([PYTHON, "-m", "ddp_preflight", "--only", "training-imports", "--python", PYTHON,
                                "--json", "--env", f"PYTHONPATH={DEPS}", "--", "-m", "scripts.base_train"],
                               capture_output=True, text=True, timeout=120, cwd=NANOCHAT,
                               env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    (result,) = json.loads(with_deps.stdout)["results"]
    assert (with_deps.returncode, result["status"]) == (0, "pass"), result
