"""Issue 34: variables that name a module rather than a path (PYTHONWARNINGS' category
`mod.Class`, imported as every Python starts; PYTHONBREAKPOINT's `mod.func`, at breakpoint();
PYTHON_PRESITE's `mod`) are judged by where the rank would import that module from: a real second
user (tests/hostile.py) controls the file found there, root runs the real launch or the rule."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ddp_preflight.node.loader_env import refusal
from tests.hostile import hostile_user

from .ports import free_port

ROOT = Path(__file__).resolve().parents[2]
HOST = socket.gethostname()


def command(*args: str) -> list[str]:
    return [sys.executable, "-P", "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
            "from ddp_preflight.cli.ddp_preflight import main; sys.exit(main())", *args]


@pytest.fixture
def user():
    return hostile_user()


@pytest.fixture
def arena():
    """A folder of root's that the intruder may enter (0755)."""
    folder = Path(tempfile.mkdtemp(prefix="ddpp-hostile-module-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def markers(arena):
    folder = arena / "markers"
    folder.mkdir()
    folder.chmod(0o777)
    return folder


def hook(markers: Path) -> str:
    return (f"import os\nopen({str(markers)!r} + '/' + __name__ + '-uid-' + str(os.getuid()), 'w').close()\n"
            "class Planted(Warning):\n    pass\n\ndef run(*a, **k):\n    pass\n")


def theirs(user, path: Path, text: str) -> Path:
    """A file in root's folder that the intruder owns (copied with its owner kept) and writes."""
    path.write_text("")
    os.chown(path, user.uid, user.gid)
    user.run(["sh", "-c", 'cat > "$1"', "sh", str(path)], input=text)
    return path


def fix(name: str, what: str) -> str:
    return f"{what}, or give {name} only modules that root alone can change, or leave it out"


def test_a_warning_category_of_the_intruders_module_starts_no_rank(user, arena, markers, tmp_path):
    code = arena / "code"
    code.mkdir()
    (code / "train.py").write_text("print('trained')\n")
    planted = theirs(user, code / "hook.py", hook(markers))     # copied with its owner kept
    done = subprocess.run(command("--no-probes", "--force", "--master-port", str(free_port()), "--launch",
                                  "--log-dir", str(tmp_path / "logs"),
                                  "--env", "PYTHONWARNINGS=ignore::hook.Planted", "--", "train.py"),
                          cwd=code, capture_output=True, text=True, timeout=300)

    assert os.listdir(markers) == []
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    why = (f"the training's PYTHONWARNINGS names the module hook, imported from {planted}, which belongs to "
           f"{user.name} (uid {user.uid}), who could change what the ranks import as root")
    assert (f"ddp-preflight: training failed on {HOST}: {why} (fix: {fix('PYTHONWARNINGS', f'chown root {planted}')})"
            "; every node was stopped") in done.stderr.splitlines(), done.stderr[-3000:]


def test_a_module_of_the_intruders_deep_in_roots_own_pythonpath_folder_is_refused(user, arena, markers):
    """Root's PYTHONPATH folder passes its walk; what the ranks import from it is walked too."""
    lib = arena / "lib"
    (lib / "tools").mkdir(parents=True)
    (lib / "tools" / "__init__.py").write_text("")
    assert refusal({"PYTHONPATH": str(lib)}, "/") is None
    planted = theirs(user, lib / "tools" / "hook.py", hook(markers))
    assert refusal({"PYTHONPATH": str(lib)}, "/") == (
        f"the training's module {planted} belongs to {user.name} (uid {user.uid}), who could change what the ranks "
        "import as root", f"chown root {planted}, or use a copy that only root can change")


def test_the_category_module_is_imported_as_python_starts_so_the_marker_can_tell(user, arena, markers):
    lib = arena / "lib"
    lib.mkdir()
    theirs(user, lib / "hook.py", hook(markers))
    subprocess.run([sys.executable, "-c", "pass"], check=True, timeout=60,
                   env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(lib), "PYTHONWARNINGS": "ignore::hook.Planted"})
    assert os.listdir(markers) == ["hook-uid-0"]


@pytest.mark.parametrize("name, value, module", [
    ("PYTHONBREAKPOINT", "hook.run", "hook"),
    ("PYTHONBREAKPOINT", "tools.hook.run", "tools.hook"),
    ("PYTHON_PRESITE", "tools.hook:run", "tools.hook"),
    ("PYTHONWARNINGS", "default,error::tools.hook.Planted:mod:1", "tools.hook"),
])
def test_each_variable_that_names_a_module_is_judged_where_the_module_is_found(user, arena, markers, name, value,
                                                                               module):
    code = arena / "code"
    (code / "tools").mkdir(parents=True)
    (code / "tools" / "__init__.py").write_text("")
    (code / "tools" / "hook.py").write_text(hook(markers))
    (code / "hook.py").write_text(hook(markers))
    assert refusal({name: value}, str(code)) is None
    planted = theirs(user, code / (module.replace(".", "/") + ".py"), hook(markers))
    assert refusal({name: value}, str(code)) == (
        f"the training's {name} names the module {module}, imported from {planted}, which belongs to {user.name} "
        f"(uid {user.uid}), who could change what the ranks import as root", fix(name, f"chown root {planted}"))
    assert os.listdir(markers) == []


def test_a_package_folder_above_the_module_is_judged_too(user, arena):
    code = arena / "code"
    (code / "tools").mkdir(parents=True)
    (code / "tools" / "hook.py").write_text("")           # a namespace package: no __init__.py
    (code / "tools").chmod(0o777)
    assert refusal({"PYTHONBREAKPOINT": "tools.hook.run"}, str(code)) == (
        f"the training's PYTHONBREAKPOINT names the module tools.hook, imported from {code}/tools, which is writable "
        "by other users (mode 777), who could change what the ranks import as root",
        fix("PYTHONBREAKPOINT", f"chmod go-w {code}/tools"))


def test_the_scripts_own_folder_is_searched_first(user, arena):
    code = arena / "code"
    (code / "sub").mkdir(parents=True)
    planted = theirs(user, code / "sub" / "hook.py", "")
    (code / "hook.py").write_text("")
    assert refusal({"PYTHONBREAKPOINT": "hook.run"}, str(code)) is None
    assert refusal({"PYTHONBREAKPOINT": "hook.run"}, str(code), str(code / "sub"))[0].startswith(
        f"the training's PYTHONBREAKPOINT names the module hook, imported from {planted}, which belongs to")


@pytest.mark.parametrize("name, value", [
    ("PYTHONBREAKPOINT", "0"), ("PYTHONBREAKPOINT", "pdb.set_trace"), ("PYTHONBREAKPOINT", "print"),
    ("PYTHONWARNINGS", "ignore::DeprecationWarning,error"), ("PYTHONWARNINGS", "ignore::json.JSONDecodeError"),
    ("PYTHON_PRESITE", "sys"), ("PYTHONBREAKPOINT", "nowhere_at_all.run"),
])
def test_the_interpreters_own_modules_and_a_module_found_nowhere_pass(arena, name, value):
    assert refusal({name: value}, str(arena)) is None
