"""Issue 23, attacks 1, 2 and 6: nothing root runs comes from a place another user can write.
A real second user (tests/hostile.py) plants modules, a venv, .pth files and fake py-spy
programs; root then runs the real commands on this machine (the local node) and none of it runs:
no marker file appears, and what is refused says so in one line naming the node, the path, its
owner and the fix. The remote variant (py-spy beside --python on a worker) is in
tests/lab/test_hostile_exec.py."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from ddp_preflight.hangwatch.watch import Watcher, WatchTarget
from ddp_preflight.transport import LocalNode
from tests.hostile import hostile_user

ROOT = Path(__file__).resolve().parents[2]
HOST = socket.gethostname()
SYSTEM_PYTHON = "/usr/bin/python3"
VERSION = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print('python%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True, check=True).stdout.strip()
# The standard modules the node programs import (and torch, csv, email: the collectors' and the
# import scan's), each planted as NAME.py that leaves a marker when imported.
PLANTED = ("json", "shutil", "signal", "tempfile", "zipfile", "subprocess", "threading", "socket", "select",
           "struct", "platform", "re", "datetime", "inspect", "ast", "hashlib", "glob", "ctypes", "pathlib",
           "typing", "dataclasses", "csv", "email", "torch", "numpy", "sitecustomize", "usercustomize")


def command(module: str, *args: str) -> list[str]:
    """The `ddp-preflight` / `hangwatch` console scripts' own lines, for this checkout (-P: the
    master itself imports nothing from the folder it runs in either)."""
    return [sys.executable, "-P", "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
            f"from ddp_preflight.cli.{module} import main; sys.exit(main())", *args]


def marker_module(markers: Path) -> str:
    return f"open({str(markers)!r} + '/' + __name__, 'w').close()\n"


@pytest.fixture
def user():
    return hostile_user()


@pytest.fixture
def markers(tmp_path):
    (tmp_path / "markers").mkdir()
    return tmp_path / "markers"


@pytest.fixture
def intruder_home(user):
    """A folder of the intruder's own, made by that user in its home; removed after the test."""
    folder = user.home / f"exec-{uuid.uuid4().hex[:8]}"
    user.run(["mkdir", "-m", "755", str(folder)])
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def plant(user, path: Path, text: str, mode: str = "644") -> None:
    """The intruder writes `path` itself."""
    user.run(["sh", "-c", 'cat > "$1" && chmod "$2" "$1"', "sh", str(path), mode], input=text)


def home_folder(user, folder: Path):
    """`folder` under the intruder's home, made by that user; returns what removes what the test
    made there (the files given, then the folders that were not there, if empty): nothing else
    of the home, which other tests may use at the same time."""
    missing = [p for p in [folder, *folder.parents] if user.home in p.parents and not p.exists()]
    user.run(["mkdir", "-p", str(folder)])

    def remove(*files: Path) -> None:
        for file in files:
            file.unlink(missing_ok=True)
        for made in missing:          # the deepest first; one another test also uses stays
            with contextlib.suppress(OSError):
                made.rmdir()
    return remove


def left(markers: Path) -> list[str]:
    return sorted(os.listdir(markers))


# --- attack 1: modules in the folder root runs the command from -------------------------------------

@pytest.fixture
def planted_folder(user, intruder_home, markers):
    for name in PLANTED:
        plant(user, intruder_home / f"{name}.py", marker_module(markers))
    plant(user, intruder_home / "train.py", "import torch\nimport json\nprint(json.dumps(torch.__version__))\n")
    return intruder_home


def test_preflight_of_this_machine_from_a_folder_the_intruder_owns_imports_nothing_of_it(planted_folder, markers):
    done = subprocess.run(command("ddp_preflight", "--json", "--", "train.py"), cwd=planted_folder,
                          capture_output=True, text=True, timeout=300)

    assert left(markers) == []
    assert "Traceback" not in done.stderr, done.stderr
    report = json.loads(done.stdout)
    statuses = {r["check"]: r["status"] for r in report["results"] if r["node"] in (HOST, None)}
    # The run still works: the node was reached, torch found, the probes ran, without running
    # any of the folder's files. The training's code is the intruder's, which root's ranks would
    # run (issue 34): training-imports refuses it in one line with the fix, and nothing else errs.
    assert statuses["node-reachable"] == statuses["torch-parity"] == statuses["compute-balance"] == "pass", report
    imports = next(r for r in report["results"] if r["check"] == "training-imports")
    assert (imports["status"], imports["summary"]) == (
        "error", f"{HOST}: the training command's imports were not resolved: the training's code folder "
                 f"{planted_folder} belongs to ddpp-intruder (uid {hostile_user().uid}), who could change what the "
                 f"ranks run as root; fix: chown root {planted_folder}, or use a copy that only root can change")
    assert [r["check"] for r in report["results"] if r["status"] == "error"] == ["training-imports"], report


def test_hangwatch_attach_to_this_machine_from_a_folder_the_intruder_owns_imports_nothing_of_it(
        planted_folder, markers, tmp_path):
    rank = subprocess.Popen(["sleep", "60"])
    try:
        done = subprocess.run(command("hangwatch", "attach", "--pid", str(rank.pid), "--json", "--for", "4",
                                      "--incident-dir", str(tmp_path / "incidents")),
                              cwd=planted_folder, capture_output=True, text=True, timeout=120)
    finally:
        rank.kill()
        rank.wait()

    assert left(markers) == []
    assert (done.returncode, done.stderr) == (0, ""), (done.returncode, done.stderr)
    events = [json.loads(line) for line in done.stdout.splitlines()]
    hello = next(e for e in events if e["event"] == "node")
    assert hello["status"] == "watching", events
    assert any(e["event"] == "rank-found" and e["pid"] == rank.pid for e in events), events


# --- attack 6: a Python, venv or site-packages another user can change -------------------------------

def reached(*args: str) -> dict:
    """This machine's node-reachable result, through the real command."""
    done = subprocess.run(command("ddp_preflight", "--only", "node-reachable", "--json", *args), cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    (result,) = json.loads(done.stdout)["results"]
    return result


def pth_marker(markers: Path) -> str:
    return f"import os; open({str(markers / 'pth')!r}, 'w').close()\n"


@pytest.fixture
def intruder_venv(user, intruder_home, markers) -> str:
    """A venv the intruder made of the system's Python, with a .pth that leaves a marker: its Python."""
    venv = intruder_home / "venv"
    user.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(venv)])
    plant(user, venv / "lib" / VERSION / "site-packages" / "evil.pth", pth_marker(markers))
    return f"{venv}/bin/python"


def test_a_venv_the_intruder_made_is_refused_and_its_pth_never_runs(user, intruder_venv, markers):
    python = intruder_venv
    result = reached("--python", python)

    assert left(markers) == []
    assert (result["status"], result["summary"], result["fix"]) == (
        "error",
        f"{HOST}: the training Python {python} is refused: {python} belongs to ddpp-intruder (uid {user.uid}), "
        "who could change what it runs as root",
        f"connect as ddpp-intruder to run ddpp-intruder's Python, or give one only root can change: --python {HOST}:PATH")


def test_hangwatch_attach_refuses_the_intruders_venv_with_the_same_line_and_fix(user, intruder_venv, markers, tmp_path):
    python = intruder_venv
    done = subprocess.run(command("hangwatch", "attach", "--python", python, "--json", "--for", "3",
                                  "--incident-dir", str(tmp_path / "incidents")),
                          cwd=ROOT, capture_output=True, text=True, timeout=120)

    assert left(markers) == []
    assert "Traceback" not in done.stderr, done.stderr
    lost = [e["text"] for e in map(json.loads, done.stdout.splitlines()) if e["event"] == "node"]
    assert lost[0].startswith(
        f"{HOST}: the agent stopped (the training Python {python} is refused: {python} belongs to ddpp-intruder "
        f"(uid {user.uid}), who could change what it runs as root; fix: connect as ddpp-intruder to run "
        f"ddpp-intruder's Python, or give one only root can change: --python {HOST}:PATH)"), lost


def test_a_python_reached_through_a_folder_anyone_may_write_is_refused(tmp_path):
    drop = tmp_path / "drop"
    drop.mkdir()
    os.chmod(drop, 0o777)
    (drop / "python").symlink_to(SYSTEM_PYTHON)

    result = reached("--python", str(drop / "python"))

    assert (result["status"], result["summary"], result["fix"]) == (
        "error",
        f"{HOST}: the training Python {drop}/python is refused: {drop} is writable by other users (mode 777), "
        "who could change what it runs as root",
        f"give a Python only root can change: --python {HOST}:PATH, or chmod go-w {drop} once you have checked what it holds")


def test_group_write_counts_only_when_the_group_holds_another_user(user, tmp_path):
    # As OpenSSH's StrictModes and node/private.py: a group of the owner alone is the owner.
    shared, private = tmp_path / "shared", tmp_path / "private"
    for folder, gid in ((shared, user.gid), (private, 0)):
        folder.mkdir()
        os.chown(folder, 0, gid)
        os.chmod(folder, 0o775)
        (folder / "python").symlink_to(SYSTEM_PYTHON)

    refused, taken = reached("--python", str(shared / "python")), reached("--python", str(private / "python"))

    assert (refused["status"], refused["summary"]) == (
        "error", f"{HOST}: the training Python {shared}/python is refused: {shared} is writable by other users "
                 "(mode 775), who could change what it runs as root")
    assert taken["status"] == "pass", taken


@pytest.fixture
def root_venv(tmp_path):
    """A venv root made (of the system's Python, without pip): root's, as the tool's user."""
    venv = tmp_path / "venv"
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    return venv


def test_a_pth_file_the_intruder_owns_in_roots_venv_is_refused_before_it_runs(user, root_venv, markers):
    site = root_venv / "lib" / VERSION / "site-packages"
    user.file(site / "evil.pth", pth_marker(markers))
    python = f"{root_venv}/bin/python"

    result = reached("--python", python)

    assert left(markers) == []
    assert (result["status"], result["summary"]) == (
        "error", f"{HOST}: the training Python {python} is refused: {site}/evil.pth belongs to ddpp-intruder "
                 f"(uid {user.uid}), who could change what it runs as root")


def test_a_site_packages_anyone_may_write_is_refused_before_its_pth_runs(root_venv, markers):
    site = root_venv / "lib" / VERSION / "site-packages"
    (site / "evil.pth").write_text(pth_marker(markers))
    os.chmod(site, 0o777)
    python = f"{root_venv}/bin/python"

    result = reached("--python", python)

    assert left(markers) == []
    assert (result["status"], result["summary"]) == (
        "error", f"{HOST}: the training Python {python} is refused: {site} is writable by other users (mode 777), "
                 "who could change what it runs as root")


def test_a_pth_file_roots_venv_adds_a_folder_of_the_intruder_with_is_refused(user, root_venv, intruder_home, markers):
    plant(user, intruder_home / "json.py", marker_module(markers))
    site = root_venv / "lib" / VERSION / "site-packages"
    (site / "project.pth").write_text(f"{intruder_home}\n")      # an editable install of someone's project
    python = f"{root_venv}/bin/python"

    result = reached("--python", python)

    assert left(markers) == []
    assert (result["status"], result["summary"]) == (
        "error", f"{HOST}: the training Python {python} is refused: {intruder_home} belongs to ddpp-intruder "
                 f"(uid {user.uid}), who could change what it runs as root")


def test_the_intruders_user_site_is_not_roots_even_when_home_says_so(user, markers):
    # sudo may keep HOME: Python's user site would then be the intruder's ~/.local.
    site = user.home / ".local" / "lib" / VERSION / "site-packages"
    remove = home_folder(user, site)
    planted = (site / "evil.pth", site / "sitecustomize.py", site / "usercustomize.py")
    try:
        plant(user, planted[0], pth_marker(markers))
        plant(user, planted[1], marker_module(markers))
        plant(user, planted[2], marker_module(markers))
        done = subprocess.run(command("ddp_preflight", "--only", "node-reachable", "--json", "--python", SYSTEM_PYTHON),
                              cwd=ROOT, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "HOME": str(user.home)})
    finally:
        remove(*planted)

    assert left(markers) == []
    (result,) = json.loads(done.stdout)["results"]
    assert result["status"] == "pass", result


# --- attack 2: py-spy from anywhere but a place another user can write -----------------------------

@pytest.fixture
def fake_py_spies(user, intruder_home, tmp_path, markers):
    """A fake py-spy (it leaves a marker) in three places root's agent used to look, with no
    trusted py-spy there: beside the training Python (a symlink in root's folder to the
    intruder's file), on the PATH (the intruder's 0777 folder), in ~/.local/bin of the HOME root
    is given (the intruder's)."""
    env_bin = tmp_path / "env" / "bin"
    env_bin.mkdir(parents=True)
    (env_bin / "python").symlink_to(SYSTEM_PYTHON)
    shared = intruder_home / "shared"
    user.run(["mkdir", "-m", "777", str(shared)])
    for name in ("beside", "path"):
        plant(user, shared / name, f"#!/bin/sh\ntouch {markers}/py-spy-{name}\n", mode="755")
    (env_bin / "py-spy").symlink_to(shared / "beside")
    on_path = intruder_home / "bin"
    user.run(["mkdir", "-m", "777", str(on_path)])
    plant(user, on_path / "py-spy", f"#!/bin/sh\ntouch {markers}/py-spy-path\n", mode="755")
    local_bin = user.home / ".local" / "bin"
    remove = home_folder(user, local_bin)
    plant(user, local_bin / "py-spy", f"#!/bin/sh\ntouch {markers}/py-spy-home\n", mode="755")
    yield {"python": str(env_bin / "python"), "beside": shared / "beside", "path": on_path / "py-spy",
           "home": local_bin / "py-spy", "shared": shared}
    remove(local_bin / "py-spy")


def owned(path, user) -> str:
    return f"{path} belongs to ddpp-intruder (uid {user.uid}), not to root or this user (root, uid 0)"


def test_no_py_spy_the_intruder_placed_is_found_beside_python_on_path_or_in_home(fake_py_spies, user, markers):
    env = {"PATH": f"{fake_py_spies['path'].parent}:/usr/bin:/bin", "HOME": str(user.home)}
    # -s, as the agent's Python runs (node/boot.py): a test beside this one plants the intruder's user site.
    done = subprocess.run([fake_py_spies["python"], "-s", "-c", "import json; from ddp_preflight.node import pyspy; "
                           "print(json.dumps(pyspy.find()))"], env={**env, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60, cwd="/")

    # Each is named with why, in the order the agent looks: beside the Python, the PATH, ~/.local/bin.
    assert json.loads(done.stdout) == [None, "; ".join([
        f"the py-spy at {Path(fake_py_spies['python']).parent}/py-spy: {owned(fake_py_spies['beside'], user)}",
        f"the py-spy at {fake_py_spies['path']}: {owned(fake_py_spies['path'], user)}",
        f"the py-spy at {fake_py_spies['home']}: {owned(fake_py_spies['home'], user)}"])], done.stderr
    assert left(markers) == []


def test_the_agent_runs_no_py_spy_the_intruder_placed_and_says_why_not_that_none_is_installed(
        fake_py_spies, user, markers, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{fake_py_spies['path'].parent}:/usr/bin:/bin")
    monkeypatch.setenv("HOME", str(user.home))
    given = fake_py_spies["shared"] / "beside"
    rank = subprocess.Popen(["sleep", "60"])
    events = []
    # The Python the agent runs is root's (/usr/bin/python3: nothing beside it); the py-spy given
    # is the intruder's, and so is every other the agent could find.
    watcher = Watcher([WatchTarget(LocalNode("here", SYSTEM_PYTHON), pids=(rank.pid,))], py_spy=str(given),
                      on_event=events.append, incident_dir=str(tmp_path / "incidents")).start()
    try:
        deadline = time.monotonic() + 60
        while not any(r.dump_error for r in watcher.state.ranks.values()):      # its stack was asked for
            assert time.monotonic() < deadline, [e.text for e in events]
            watcher.dump_stacks()
            time.sleep(0.5)
    finally:
        watcher.close()
        rank.send_signal(signal.SIGKILL)
        rank.wait()

    assert left(markers) == []
    notices = [e.text for e in events if e.kind == "notice" and "py-spy" in e.text]
    # One notice: every py-spy refused, with why; not "py-spy is not installed".
    assert notices == [
        f"here: the agent did not run the py-spy it was given: {owned(given, user)}; "
        f"the py-spy at {fake_py_spies['path']}: {owned(fake_py_spies['path'], user)}; "
        f"the py-spy at {fake_py_spies['home']}: {owned(fake_py_spies['home'], user)}; "
        "stacks are missing; fix: pip install py-spy in the training environment on that node"], notices


# --- the programs the collectors run (ip, git, nvidia-smi) ------------------------------------------

def test_a_program_the_collectors_run_is_never_one_the_intruder_placed_on_the_path(
        user, intruder_home, markers, monkeypatch):
    from ddp_preflight.node.facts.util import command as collector_command

    on_path = intruder_home / "bin"
    user.run(["mkdir", "-m", "777", str(on_path)])
    plant(user, on_path / "ip", f"#!/bin/sh\ntouch {markers}/ip\n", mode="755")
    monkeypatch.setenv("PATH", f"{on_path}:/usr/sbin:/usr/bin:/sbin:/bin")

    done = collector_command(["ip", "-j", "addr", "show"])

    assert (done.returncode, done.stdout, done.stderr) == (126, "", f"ip was not run: {owned(on_path / 'ip', user)}")
    # An empty PATH entry is the current folder: never searched, so the system's ip runs.
    monkeypatch.setenv("PATH", ":/usr/sbin:/usr/bin:/sbin:/bin")
    monkeypatch.chdir(on_path)
    done = collector_command(["ip", "-j", "addr", "show"])
    assert done.returncode == 0 and json.loads(done.stdout), done.stderr
    assert left(markers) == []


def test_what_the_same_user_installed_with_pip_install_user_is_still_found(tmp_path):
    # Root's own user site (PYTHONUSERBASE, as pip install --user puts it there): the node
    # programs open it, so the scan of the training's imports finds what is installed there.
    base = tmp_path / "userbase"
    site = base / "lib" / VERSION / "site-packages"
    site.mkdir(parents=True)
    (site / "userpkg.py").write_text("VALUE = 1\n")
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("import json\nimport userpkg\n")

    def imports(env: dict) -> dict:
        done = subprocess.run(command("ddp_preflight", "--only", "training-imports", "--json", "--python", SYSTEM_PYTHON,
                                      "--", "train.py"), cwd=code, capture_output=True, text=True, timeout=120,
                              env={**os.environ, **env})
        (result,) = json.loads(done.stdout)["results"]
        return result

    # (The system's Python has no torch: that is the check's finding either way.)
    found = imports({"PYTHONUSERBASE": str(base)})["details"]
    assert (found["external"], found["missing"]) == (["userpkg"], []), found
    assert [m["module"] for m in imports({})["details"]["missing"]] == ["userpkg"]


# --- the red team's variants (issue 23, second round) -----------------------------------------------

def result_of(done: subprocess.CompletedProcess, check: str, node: str = HOST) -> dict:
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return next(r for r in json.loads(done.stdout)["results"] if r["check"] == check and r["node"] in (node, None))


def release(fifo: Path) -> None:
    """What a failed run left blocked on the FIFO (a reader waiting in open()) goes on: a writer
    opens it once and closes it."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


# fabric reads ~/.fabric.{py,yaml,yml,json} of whatever HOME says (sudo may keep another user's):
# a .fabric.py runs as root; a .fabric.yaml's ssh_config_path names an ssh config no one checked,
# whose Match exec runs as root. Only the ssh config given (and checked) is read.
FABRIC_FILES = {
    ".fabric.py": "open({markers!r} + '/fabric.py', 'w').close()\n",
    ".fabric.yaml": "ssh_config_path: {config}\n",
}


@pytest.mark.parametrize("name", sorted(FABRIC_FILES))
def test_fabric_reads_no_config_file_from_the_home_it_is_given(user, intruder_home, markers, tmp_path, name):
    from .ports import free_port

    config = intruder_home / "ssh_config"     # the intruder's: never checked, never to be read
    plant(user, config, f'Match exec "touch {markers}/match-exec"\n  User root\n')
    dotfile = user.home / name
    plant(user, dotfile, FABRIC_FILES[name].format(markers=str(markers), config=config))
    given = tmp_path / "ssh_config"          # root's own: the one --ssh-config names, and is checked
    given.write_text(f"Host target\n  HostName 127.0.0.1\n  Port {free_port()}\n")
    try:
        done = subprocess.run(command("ddp_preflight", "--only", "node-reachable", "--json", "--ssh-config",
                                      str(given), "target"), cwd=ROOT, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "HOME": str(user.home)})
    finally:
        dotfile.unlink(missing_ok=True)

    assert left(markers) == []
    result = result_of(done, "node-reachable", "target")
    assert (result["status"], result["summary"]) == ("error", "target: nothing accepts ssh connections (connection refused)")


# A folder on root's PATH that another user can write, or an empty PATH entry (the current
# folder): nothing there runs, neither the `sh` in front of the Python nor the tools it uses.
WRAPPER_TOOLS = ("sh", "dash", "bash", "stat", "head", "readlink", "id", "getent", "awk", "tr", "grep", "cat", "ls")


@pytest.mark.parametrize("how", ["writable-folder", "empty-entry"])
def test_no_tool_of_the_python_check_comes_from_a_folder_on_roots_path_the_intruder_can_write(
        user, intruder_home, markers, how):
    on_path = intruder_home / "bin"
    user.run(["mkdir", "-m", "777", str(on_path)])
    for tool in WRAPPER_TOOLS:
        plant(user, on_path / tool, f"#!/bin/sh\ntouch {markers}/{tool}\n", mode="755")
    path = f"{on_path}:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" if how == "writable-folder" \
        else ":/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

    done = subprocess.run(command("ddp_preflight", "--only", "node-reachable", "--json"), capture_output=True,
                          text=True, timeout=120, cwd=on_path, env={**os.environ, "PATH": path})

    assert left(markers) == []
    assert result_of(done, "node-reachable")["status"] == "pass", done.stdout[-3000:]


def test_node_programs_start_sh_by_its_path():
    from ddp_preflight.transport.errors import python_argv
    from ddp_preflight.transport.payload import boot_argv

    assert python_argv("python3")[:2] == boot_argv("/usr/bin/python3")[:2] == ["/bin/sh", "-c"]


# PYTHONPATH (--env, the config, or the node's own environment): the node programs ignore it
# (python -I), and one whose folders another user can change is refused before any job starts,
# in one line naming the folder and its owner: the ranks would import from it as root.
STDLIB_PLANTED = ("typing", "json", "os", "stat", "subprocess", "inspect", "ast", "importlib", "signal",
                  "threading", "tempfile", "shutil", "zipfile", "socket", "struct", "pathlib", "dataclasses",
                  "functools", "enum", "contextlib", "fnmatch", "glob", "hashlib", "site", "sitecustomize",
                  "usercustomize", "torch")


@pytest.fixture
def intruder_pythonpath(user, intruder_home, markers) -> Path:
    for name in STDLIB_PLANTED:
        plant(user, intruder_home / f"{name}.py", marker_module(markers))
    return intruder_home


def pythonpath_refusal(folder: Path, user) -> str:
    return (f"the training's PYTHONPATH folder {folder} belongs to ddpp-intruder (uid {user.uid}), who could "
            "change what the ranks import as root")


def train_folder(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("import json\nprint(json.dumps(1))\n")
    return code


def test_a_pythonpath_given_with_env_imports_nothing_and_is_refused_in_one_line(
        user, intruder_pythonpath, markers, tmp_path):
    code = train_folder(tmp_path)
    done = subprocess.run(command("ddp_preflight", "--only", "node-reachable,training-imports", "--json", "--env",
                                  f"PYTHONPATH={intruder_pythonpath}", "--", "train.py"),
                          cwd=code, capture_output=True, text=True, timeout=120)

    assert left(markers) == []
    assert result_of(done, "node-reachable")["status"] == "pass"
    imports = result_of(done, "training-imports")
    assert (imports["status"], imports["summary"]) == (
        "error", f"{HOST}: the training command's imports were not resolved: "
                 + pythonpath_refusal(intruder_pythonpath, user))


def test_a_pythonpath_in_the_nodes_environment_imports_nothing_and_is_refused(
        user, intruder_pythonpath, markers, tmp_path):
    code = train_folder(tmp_path)
    # -E: the master itself is this test's, not what is tried; the node programs get the variable.
    argv = command("ddp_preflight", "--only", "node-reachable,training-imports", "--json", "--", "train.py")
    done = subprocess.run([argv[0], "-E", *argv[1:]], cwd=code, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(intruder_pythonpath)})

    assert left(markers) == []
    assert result_of(done, "node-reachable")["status"] == "pass"
    assert result_of(done, "training-imports")["summary"] == (
        f"{HOST}: the training command's imports were not resolved: " + pythonpath_refusal(intruder_pythonpath, user))


def test_a_launch_with_the_intruders_pythonpath_starts_no_rank_and_says_why(user, intruder_pythonpath, markers, tmp_path):
    from .ports import free_port

    code = train_folder(tmp_path)
    done = subprocess.run(command("ddp_preflight", "--no-probes", "--force", "--master-port", str(free_port()),
                                  "--launch", "--log-dir", str(tmp_path / "logs"), "--env",
                                  f"PYTHONPATH={intruder_pythonpath}", "--", "train.py"),
                          cwd=code, capture_output=True, text=True, timeout=300)

    assert left(markers) == []
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert (f"ddp-preflight: training failed on {HOST}: {pythonpath_refusal(intruder_pythonpath, user)} (fix: give "
            "PYTHONPATH only folders that root alone can change, or leave it out); every node was stopped") \
        in done.stderr.splitlines(), \
        done.stderr[-3000:]


def test_the_import_scan_still_finds_modules_on_a_pythonpath_root_owns(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "roots_helpers.py").write_text("VALUE = 1\n")
    code = train_folder(tmp_path)
    (code / "train.py").write_text("import json\nimport roots_helpers\n")

    done = subprocess.run(command("ddp_preflight", "--only", "training-imports", "--json", "--python", SYSTEM_PYTHON,
                                  "--env", f"PYTHONPATH={lib}", "--", "train.py"),
                          cwd=code, capture_output=True, text=True, timeout=120)

    found = result_of(done, "training-imports")["details"]
    assert (found["external"], found["missing"]) == (["roots_helpers"], []), found


# POSIX ACLs: root's file or folder with `setfacl -m u:ddpp-intruder:rwx` keeps a private-looking
# mode, and yet the intruder may write it. Each walk counts the ACL.

@pytest.fixture
def arena():
    """A folder of root's that the intruder may enter (0755)."""
    import tempfile
    folder = Path(tempfile.mkdtemp(prefix="ddpp-hostile-exec-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_python_in_a_folder_with_an_acl_for_the_intruder_is_refused(user, arena):
    from tests.acl import grant

    drop = arena / "drop"
    drop.mkdir(mode=0o755)
    (drop / "python").symlink_to(SYSTEM_PYTHON)
    grant(drop, user.uid)
    user.run(["touch", str(drop / "theirs")])        # the ACL is real: the intruder writes there
    (drop / "theirs").unlink()

    result = reached("--python", str(drop / "python"))

    assert (result["status"], result["summary"], result["fix"]) == (
        "error",
        f"{HOST}: the training Python {drop}/python is refused: {drop} is writable by other users (mode 775, with an "
        "ACL), who could change what it runs as root",
        f"give a Python only root can change: --python {HOST}:PATH, or setfacl -b {drop} once you have checked what it holds")


@pytest.mark.parametrize("target", ["site-packages", "pth"])
def test_a_site_with_an_acl_for_the_intruder_is_refused_before_its_pth_runs(user, root_venv, markers, target):
    from tests.acl import grant

    site = root_venv / "lib" / VERSION / "site-packages"
    pth = site / "project.pth"
    pth.write_text(pth_marker(markers))
    granted = site if target == "site-packages" else pth
    grant(granted, user.uid)
    mode = f"{granted.stat().st_mode & 0o7777:o}"      # its group bits are the ACL's mask now
    python = f"{root_venv}/bin/python"

    result = reached("--python", python)

    assert left(markers) == []
    assert (result["status"], result["summary"]) == (
        "error", f"{HOST}: the training Python {python} is refused: {granted} is writable by other users "
                 f"(mode {mode}, with an ACL), who could change what it runs as root")


# A FIFO named *.pth in a site-packages folder: the site (and the check before it) would open it
# and wait forever, before any lease exists.

def test_a_fifo_pth_the_intruder_put_in_a_writable_site_is_refused_at_once(user, root_venv):
    site = root_venv / "lib" / VERSION / "site-packages"
    os.chmod(site, 0o777)
    os.mkfifo(site / "aaa.pth")       # as the intruder would (root's tmp_path is closed to it): its FIFO
    user.own(site / "aaa.pth")
    python = f"{root_venv}/bin/python"
    try:
        result = reached("--python", python)
    finally:
        release(site / "aaa.pth")

    assert (result["status"], result["summary"]) == (
        "error", f"{HOST}: the training Python {python} is refused: {site} is writable by other users (mode 777), "
                 "who could change what it runs as root")


def test_a_fifo_pth_in_roots_own_site_is_refused_not_waited_on(root_venv):
    site = root_venv / "lib" / VERSION / "site-packages"
    os.mkfifo(site / "aaa.pth")
    python = f"{root_venv}/bin/python"
    try:
        result = reached("--python", python)
    finally:
        release(site / "aaa.pth")

    assert (result["status"], result["summary"]) == (
        "error", f"{HOST}: the training Python {python} is refused: {site}/aaa.pth is a FIFO, not a regular file, "
                 "which Python's site would wait on forever")
