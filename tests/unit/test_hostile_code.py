"""Issue 34, part A, item 2: a config, a code folder, a script and its folder, a module beside it
and a data folder that another user owns or may write are refused, with the command that fixes
it, like PYTHONPATH; --force changes nothing. A real second user (tests/hostile.py) plants what
leaves a marker when run; root runs the real `ddp-preflight` (and --launch) on this machine."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from ddp_preflight.node.loader_env import code_refusal
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
def markers(tmp_path):
    folder = tmp_path / "markers"
    folder.mkdir()
    folder.chmod(0o777)
    return folder


@pytest.fixture
def arena():
    """A folder of root's that the intruder may enter (0755)."""
    folder = Path(tempfile.mkdtemp(prefix="ddpp-hostile-code-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def intruder_home(user):
    folder = user.home / f"code-{uuid.uuid4().hex[:8]}"
    user.run(["mkdir", "-m", "755", str(folder)])
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def plant(user, path: Path, text: str) -> Path:
    user.run(["sh", "-c", 'cat > "$1"', "sh", str(path)], input=text)
    return path


def marker_module(markers: Path) -> str:
    return f"import os\nopen({str(markers)!r} + '/' + __name__ + '-uid-' + str(os.getuid()), 'w').close()\n"


def left(markers: Path) -> list[str]:
    return sorted(os.listdir(markers))


def launch(cwd: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(command("--no-probes", "--force", "--master-port", str(free_port()), "--launch",
                                  "--log-dir", str(tmp_path / "logs"), *extra, "--", "train.py"),
                          cwd=cwd, capture_output=True, text=True, timeout=300)


def failed_line(done: subprocess.CompletedProcess, why: str, fix: str) -> None:
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert (f"ddp-preflight: training failed on {HOST}: {why} (fix: {fix}); every node was stopped") \
        in done.stderr.splitlines(), done.stderr[-3000:]


def test_a_config_of_another_user_is_refused_whole_and_its_env_never_reaches_anything(user, intruder_home,
                                                                                       markers, arena):
    (intruder_home / "lib").mkdir()
    shutil.chown(intruder_home / "lib", user.uid, user.gid)
    plant(user, intruder_home / "lib" / "json.py", marker_module(markers))
    config = plant(user, intruder_home / "cluster.toml", f'[env]\nPYTHONPATH = "{intruder_home}/lib"\n')
    done = subprocess.run(command("--force", "--config", str(config), "--launch", "--", "train.py"), cwd=arena,
                          capture_output=True, text=True, timeout=120)

    assert left(markers) == []
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"ddp-preflight: error: config {config} is refused: it belongs to {user.name} (uid "
                           f"{user.uid}), who could change what runs as root (its [env], python and hosts): chown root "
                           f"{config}, or give a config that only root can change\n")


def test_roots_config_in_a_group_writable_folder_with_the_intruder_in_the_group_is_refused(user, arena):
    shared = arena / "shared"
    shared.mkdir()
    os.chown(shared, 0, user.gid)
    shared.chmod(0o775)
    config = shared / "cluster.toml"
    config.write_text("hosts = []\n")
    done = subprocess.run(command("--config", str(config), "--only", "node-reachable"), cwd=arena, capture_output=True, text=True,
                          timeout=60)
    assert done.stderr == (f"ddp-preflight: error: config {config} is refused: {shared} is writable by other users "
                           "(mode 775), who could change what runs as root (its [env], python and hosts): chmod go-w "
                           f"{shared}, or give a config that only root can change\n")


def test_roots_script_in_a_folder_anyone_may_write_starts_no_rank(user, arena, markers, tmp_path):
    code = arena / "code"
    code.mkdir()
    code.chmod(0o777)                 # not sticky: the intruder may add and replace files
    (code / "train.py").write_text("import helpers\n")
    plant(user, code / "helpers.py", marker_module(markers))
    done = launch(code, tmp_path)

    assert left(markers) == []
    failed_line(done, f"the training's code folder {code} is writable by other users (mode 777), who could change "
                      "what the ranks run as root", f"chmod go-w {code}, or use a copy that only root can change")


def test_a_code_folder_the_intruder_owns_starts_no_rank_even_with_force(user, intruder_home, markers, tmp_path):
    plant(user, intruder_home / "train.py", "import helpers\n")
    plant(user, intruder_home / "helpers.py", marker_module(markers))
    done = launch(intruder_home, tmp_path)

    assert left(markers) == []
    failed_line(done, f"the training's code folder {intruder_home} belongs to {user.name} (uid {user.uid}), who could "
                      "change what the ranks run as root",
                f"chown root {intruder_home}, or use a copy that only root can change")


def test_a_script_linked_into_the_intruders_folder_starts_no_rank(user, intruder_home, arena, markers, tmp_path):
    code = arena / "code"
    code.mkdir()
    plant(user, intruder_home / "train.py", marker_module(markers))
    (code / "train.py").symlink_to(intruder_home / "train.py")
    done = launch(code, tmp_path)

    assert left(markers) == []
    failed_line(done, f"the training's script {code}/train.py is refused: {intruder_home}/train.py belongs to "
                      f"{user.name} (uid {user.uid}), who could change what the ranks run as root",
                f"chown root {intruder_home}/train.py, or use a copy that only root can change")


def test_a_module_of_the_intruders_in_roots_own_folder_is_refused_by_the_import_scan(user, arena, markers):
    code = arena / "code"
    code.mkdir()
    (code / "train.py").write_text("import json\nimport helpers\n")
    helpers = code / "helpers.py"
    helpers.write_text(marker_module(markers))
    os.chown(helpers, user.uid, user.gid)      # copied with its owner kept (cp -a, tar as root)
    done = subprocess.run(command("--only", "training-imports", "--json", "--", "train.py"), cwd=code,
                          capture_output=True, text=True, timeout=120)

    assert left(markers) == []
    [result] = json.loads(done.stdout)["results"]
    assert (result["status"], result["summary"]) == (
        "error", f"{HOST}: the training command's imports were not resolved: the training's module {helpers} belongs "
                 f"to {user.name} (uid {user.uid}), who could change what the ranks import as root; fix: chown root "
                 f"{helpers}, or use a copy that only root can change")


def test_a_data_folder_the_intruder_owns_is_refused_and_roots_is_read(user, intruder_home, arena):
    plant(user, intruder_home / "shard_000.bin", "x" * 100)
    done = subprocess.run(command("--only", "data-shards", "--json", "--data-dir", str(intruder_home)), cwd=arena,
                          capture_output=True, text=True, timeout=120)
    [result] = [r for r in json.loads(done.stdout)["results"] if r["node"] == HOST]
    assert (result["status"], result["summary"]) == (
        "error", f"the training's data folder {intruder_home} belongs to {user.name} (uid {user.uid}), who could "
                 f"change what the ranks read as root; fix: chown root {intruder_home}, or use a copy that only root "
                 "can change")

    data = arena / "data"
    data.mkdir()
    (data / "shard_000.bin").write_text("x" * 100)
    done = subprocess.run(command("--only", "data-shards", "--json", "--data-dir", str(data)), cwd=arena,
                          capture_output=True, text=True, timeout=120)
    [result] = [r for r in json.loads(done.stdout)["results"] if r["node"] == HOST]
    assert result["status"] == "pass" and result["summary"].startswith("1 shards, "), result


def test_roots_own_code_passes_and_a_group_writable_folder_of_the_intruders_group_does_not(user, arena):
    code = arena / "code"
    code.mkdir()
    (code / "train.py").write_text("print(1)\n")
    assert code_refusal(str(code), "train.py") is None
    os.chown(code, 0, user.gid)
    code.chmod(0o775)
    assert code_refusal(str(code), "train.py") == (
        f"the training's code folder {code} is writable by other users (mode 775), who could change what the ranks "
        "run as root", f"chmod go-w {code}, or use a copy that only root can change")


def test_a_sticky_world_writable_code_folder_is_no_rescue_for_the_code_in_it(user, arena, markers, tmp_path):
    """/tmp-like (1777): the intruder cannot replace root's train.py there, but can add a
    helpers.py that the script's folder, first on sys.path, gives to `import helpers`."""
    code = arena / "code"
    code.mkdir()
    code.chmod(0o1777)
    (code / "train.py").write_text("import helpers\n")
    plant(user, code / "helpers.py", marker_module(markers))
    done = launch(code, tmp_path)

    assert left(markers) == []
    failed_line(done, f"the training's code folder {code} is writable by other users (mode 1777), who could change "
                      "what the ranks run as root", f"chmod go-w {code}, or use a copy that only root can change")


def test_ld_preload_in_a_config_of_roots_for_one_node_is_refused_there(user, arena, markers, tmp_path):
    from tests.unit.test_hostile_env import planted_library

    folder = user.home / f"code-{uuid.uuid4().hex[:8]}"
    user.run(["mkdir", "-m", "755", str(folder)])
    try:
        library = planted_library(user, folder, markers)
        code = arena / "code"
        code.mkdir()
        (code / "train.py").write_text("print(1)\n")
        config = tmp_path / "cluster.toml"
        config.write_text(f'[nodes.{HOST}.env]\nLD_PRELOAD = "{library}"\n')
        done = launch(code, tmp_path, "--config", str(config))
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    assert left(markers) == []
    failed_line(done, f"the training's LD_PRELOAD file {library} belongs to {user.name} (uid {user.uid}), who could "
                      "change what the ranks load as root",
                "give LD_PRELOAD only files that root alone can change, or leave it out")


def test_a_file_deep_in_a_package_of_roots_code_that_the_intruder_may_write_starts_no_rank(user, arena, markers,
                                                                                            tmp_path):
    """Only the top of the code folder was walked: root's package with one sub-file the intruder
    may write (made 0666 by a careless copy) ran the intruder's code in every root rank."""
    code = arena / "code"
    (code / "pkg" / "models").mkdir(parents=True)
    (code / "train.py").write_text("import pkg.models.net\n")
    (code / "pkg" / "__init__.py").write_text("")
    (code / "pkg" / "models" / "__init__.py").write_text("")
    net = code / "pkg" / "models" / "net.py"
    net.write_text("x = 1\n")
    net.chmod(0o666)
    user.run(["sh", "-c", 'cat > "$1"', "sh", str(net)], input=marker_module(markers))     # the attack itself
    done = launch(code, tmp_path)

    assert left(markers) == []
    failed_line(done, f"the training's module {net} is writable by other users (mode 666), who could change what the "
                      "ranks import as root", f"chmod go-w {net}, or use a copy that only root can change")


@pytest.mark.parametrize("where", ["namespace folder", "pycache", "extension", "deep folder acl"])
def test_every_importable_thing_below_the_code_folder_is_judged(user, arena, where):
    """Variants of the same family: what another user controls anywhere an import can reach."""
    code = arena / "code"
    deep = code / "src" / "a" / "b"
    deep.mkdir(parents=True)
    (code / "train.py").write_text("print(1)\n")
    (deep / "mod.py").write_text("")
    assert code_refusal(str(code), "train.py") is None
    if where == "namespace folder":          # no __init__.py: still `import src.a.b.mod`
        target = code / "src" / "a"
        os.chown(target, user.uid, user.gid)
        why = f"the training's package {target} belongs to {user.name} (uid {user.uid})"
        fix = f"chown root {target}"
    elif where == "pycache":                # its .pyc is imported in place of the source
        target = deep / "__pycache__"
        target.mkdir()
        target.chmod(0o777)
        why = f"the training's package {target} is writable by other users (mode 777)"
        fix = f"chmod go-w {target}"
    elif where == "extension":
        target = deep / "fast.cpython-311-x86_64-linux-gnu.so"
        target.write_bytes(b"")
        os.chown(target, user.uid, user.gid)
        why = f"the training's module {target} belongs to {user.name} (uid {user.uid})"
        fix = f"chown root {target}"
    else:
        target = deep
        from tests.acl import grant

        grant(target, user.uid)                     # setfacl -m u:intruder:rwx
        why = f"the training's package {target} is writable by other users (mode 775, with an ACL)"
        fix = f"setfacl -b {target}"
    assert code_refusal(str(code), "train.py") == (
        f"{why}, who could change what the ranks import as root", f"{fix}, or use a copy that only root can change")


def test_what_no_import_can_name_below_the_code_folder_is_not_judged(user, arena):
    code = arena / "code"
    code.mkdir()
    (code / "train.py").write_text("print(1)\n")
    for name in (".git", "my-data", "runs.d"):
        user.folder(code / name)
    user.file(code / "README.md", "x", mode=0o666)
    user.file(code / "shard_000.bin", "x", mode=0o666)
    assert code_refusal(str(code), "train.py") is None


def test_a_linked_folder_inside_the_code_is_walked_to_its_target_once(user, arena, intruder_home):
    code = arena / "code"
    code.mkdir()
    (code / "train.py").write_text("print(1)\n")
    (code / "loop").symlink_to(code)                  # walked once, not for ever
    assert code_refusal(str(code), "train.py") is None
    (code / "shared").symlink_to(intruder_home)
    assert code_refusal(str(code), "train.py") == (
        f"the training's package {code}/shared is refused: {intruder_home} belongs to {user.name} (uid {user.uid}), "
        "who could change what the ranks import as root",
        f"chown root {intruder_home}, or use a copy that only root can change")


def test_the_walk_of_the_code_folder_is_bounded_and_says_so(arena, monkeypatch):
    from ddp_preflight.node import code_files

    code = arena / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "train.py").write_text("print(1)\n")
    for i in range(30):
        (code / "pkg" / f"m{i}.py").write_text("")
    assert code_files.first_untrusted(str(code), most_names=31)[::2] == (31, 31)
    assert code_files.first_untrusted(str(code), most_names=32) is None
    assert code_files.first_untrusted(str(code), most_seconds=0.0)[::2] == (0, code_files.MOST_NAMES)
    monkeypatch.setattr(code_files, "MOST_NAMES", 20)
    why, fix = code_refusal(str(code), "train.py")
    assert why.startswith(f"the walk of the training's code folder {code} stopped after 20 names in ")
    assert why.endswith(" s (its bound: 20 names, 10 s): not all it holds that the ranks may import was checked")
    assert fix == "give --code-dir the folder that holds the code alone (keep data, runs and caches outside it)"


def test_a_data_folder_the_intruder_owns_starts_no_rank_even_with_force(user, intruder_home, arena, markers, tmp_path):
    """--force let data-shards' error pass, and root's ranks read what the intruder chose."""
    plant(user, intruder_home / "shard_000.bin", "x" * 100)
    code = arena / "code"
    code.mkdir()
    (code / "train.py").write_text(f"open({str(markers)!r} + '/trained', 'w').close()\n")
    done = launch(code, tmp_path, "--data-dir", str(intruder_home))

    assert left(markers) == []
    failed_line(done, f"the training's data folder {intruder_home} belongs to {user.name} (uid {user.uid}), who could "
                      "change what the ranks read as root",
                f"chown root {intruder_home}, or use a copy that only root can change")


def test_data_beside_the_code_costs_the_walk_no_name_of_its_bound(arena, monkeypatch):
    """A data/ of shards inside the code folder: listed (bounded in time), never counted or held."""
    from ddp_preflight.node import code_files

    code = arena / "code"
    (code / "data").mkdir(parents=True)
    (code / "train.py").write_text("print(1)\n")
    for i in range(2000):
        (code / "data" / f"shard_{i:05d}.bin").write_bytes(b"")
    monkeypatch.setattr(code_files, "MOST_NAMES", 10)
    assert code_refusal(str(code), "train.py") is None
