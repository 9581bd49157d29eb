"""Issue 34, part A, item 1: no variable that makes the loader, Python or a shell load something
reaches a root process unless only root (or the tool's user) can change what it names.

A real second user (tests/hostile.py) compiles a shared object whose constructor leaves a marker
file named with the uid it ran as, and plants Python modules and .pyc files that do the same.
Root then runs the real `ddp-preflight` on this machine (the local node) with those paths in
`--env`: nothing planted runs (no marker), the refusal is one exact line, and the same run with
root's own paths is unaffected."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from ddp_preflight.node.loader_env import refusal, tool_env
from tests.hostile import hostile_user

ROOT = Path(__file__).resolve().parents[2]
HOST = socket.gethostname()
MARKER_SO = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void planted(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/uid-%d-pid-%d", MARKERS, (int)getuid(), (int)getpid());
    FILE *f = fopen(path, "w");
    if (f) fclose(f);
}
"""


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
    folder.chmod(0o777)       # the planted code may run as either user: its marker says which
    return folder


@pytest.fixture
def intruder_home(user):
    folder = user.home / f"env-{uuid.uuid4().hex[:8]}"
    user.run(["mkdir", "-m", "755", str(folder)])
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def planted_library(user, folder: Path, markers: Path, name: str = "libplanted.so") -> Path:
    """The intruder compiles a library whose constructor leaves a marker, in its own folder."""
    source = folder / "planted.c"
    user.run(["sh", "-c", 'cat > "$1"', "sh", str(source)], input=MARKER_SO)
    user.run(["gcc", "-shared", "-fPIC", f'-DMARKERS="{markers}"', "-o", str(folder / name), str(source)])
    return folder / name


def left(markers: Path) -> list[str]:
    return sorted(os.listdir(markers))


def result_of(done: subprocess.CompletedProcess, check: str) -> dict:
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return next(r for r in json.loads(done.stdout)["results"] if r["check"] == check and r["node"] in (HOST, None))


def train_folder(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("import json\nprint(json.dumps(1))\n")
    return code


def refused_line(name: str, noun: str, path: Path, user, verb: str = "load", via: str = "") -> str:
    said = (f"is refused: {via} belongs to ddpp-intruder (uid {user.uid})" if via
            else f"belongs to ddpp-intruder (uid {user.uid})")
    return f"the training's {name} {noun} {path} {said}, who could change what the ranks {verb} as root"


def test_ld_preload_given_with_env_runs_nowhere_in_a_plain_preflight_and_is_refused(user, intruder_home, markers,
                                                                                    tmp_path):
    library = planted_library(user, intruder_home, markers)
    code = train_folder(tmp_path)
    # Every collector runs (ip, git, nvidia-smi where there is one) and the import scan.
    done = subprocess.run(command("--only", "node-reachable,training-imports,code-parity", "--json",
                                  "--env", f"LD_PRELOAD={library}", "--", "train.py"),
                          cwd=code, capture_output=True, text=True, timeout=180)

    assert left(markers) == []
    assert result_of(done, "node-reachable")["status"] == "pass"
    imports = result_of(done, "training-imports")
    assert (imports["status"], imports["summary"]) == (
        "error", f"{HOST}: the training command's imports were not resolved: "
                 + refused_line("LD_PRELOAD", "file", library, user))


def test_the_planted_library_does_run_when_loaded_so_the_marker_can_tell(user, intruder_home, markers):
    """The proof holds only if the library leaves its marker when something loads it."""
    library = planted_library(user, intruder_home, markers)
    subprocess.run(["/bin/true"], env={"LD_PRELOAD": str(library)}, check=True)
    assert [m.split("-pid-")[0] for m in left(markers)] == ["uid-0"]


def test_a_launch_with_ld_preload_of_the_intruders_starts_no_rank_and_says_why(user, intruder_home, markers, tmp_path):
    from .ports import free_port

    library = planted_library(user, intruder_home, markers)
    code = train_folder(tmp_path)
    done = subprocess.run(command("--no-probes", "--force", "--master-port", str(free_port()), "--launch",
                                  "--log-dir", str(tmp_path / "logs"), "--env", f"LD_PRELOAD={library}",
                                  "--", "train.py"),
                          cwd=code, capture_output=True, text=True, timeout=300)

    assert left(markers) == []
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert (f"ddp-preflight: training failed on {HOST}: {refused_line('LD_PRELOAD', 'file', library, user)} "
            "(fix: give LD_PRELOAD only files that root alone can change, or leave it out); every node was stopped") \
        in done.stderr.splitlines(), done.stderr[-3000:]


def test_a_launch_with_roots_own_ld_library_path_runs_as_before(tmp_path):
    from .ports import free_port

    lib = tmp_path / "lib"
    lib.mkdir()
    code = train_folder(tmp_path)
    (code / "train.py").write_text("import os\nprint('LDLP', os.environ['LD_LIBRARY_PATH'])\n")
    done = subprocess.run(command("--no-probes", "--force", "--master-port", str(free_port()), "--launch",
                                  "--log-dir", str(tmp_path / "logs"), "--env", f"LD_LIBRARY_PATH={lib}",
                                  "--", "train.py"),
                          cwd=code, capture_output=True, text=True, timeout=300)

    assert done.returncode == 0, done.stderr[-3000:]
    assert f"LDLP {lib}" in done.stdout + done.stderr


# The rule itself, on the intruder's real files: every kind of variable, every way to reach them.

def test_a_pycache_prefix_of_the_intruders_is_refused(user, intruder_home):
    assert refusal({"PYTHONPYCACHEPREFIX": str(intruder_home)}, "/") == (
        refused_line("PYTHONPYCACHEPREFIX", "folder", intruder_home, user, "import"),
        "give PYTHONPYCACHEPREFIX only folders that root alone can change, or leave it out")


@pytest.mark.parametrize("name, noun, verb", [
    ("LD_AUDIT", "file", "load"), ("PYTHONSTARTUP", "file", "run"), ("BASH_ENV", "file", "run"),
    ("ENV", "file", "run"), ("OPENSSL_CONF", "file", "load"), ("LD_LIBRARY_PATH", "folder", "load"),
    ("GCONV_PATH", "folder", "load"), ("PYTHONHOME", "folder", "import"), ("PYTHONUSERBASE", "folder", "import"),
])
def test_every_variable_that_loads_something_is_refused_on_the_intruders_path(user, intruder_home, markers,
                                                                               name, noun, verb):
    path = intruder_home if noun == "folder" else planted_library(user, intruder_home, markers)
    assert refusal({name: str(path)}, "/")[0] == refused_line(name, noun, path, user, verb)


def test_ld_preload_refused_among_several_libraries_and_spaces(user, intruder_home, markers):
    library = planted_library(user, intruder_home, markers)
    libm = next(p for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib64/libm.so.6") if os.path.exists(p))
    assert refusal({"LD_PRELOAD": f"libc.so.6 {libm}"}, "/") is None
    assert refusal({"LD_PRELOAD": f"{libm}:{library}"}, "/")[0] == refused_line("LD_PRELOAD", "file", library, user)


def test_an_unlisted_ld_variable_naming_the_intruders_path_is_refused(user, intruder_home):
    assert refusal({"LD_PROFILE_OUTPUT": str(intruder_home)}, "/")[0] == \
        refused_line("LD_PROFILE_OUTPUT", "path", intruder_home, user)
    assert refusal({"LD_BIND_NOW": "1", "PYTHONUNBUFFERED": "1", "PYTHONBREAKPOINT": "0"}, "/") is None


def test_a_root_owned_symlink_into_the_intruders_folder_is_refused(user, intruder_home, tmp_path):
    link = tmp_path / "lib"
    link.symlink_to(intruder_home)
    assert refusal({"LD_LIBRARY_PATH": str(link)}, "/")[0] == \
        refused_line("LD_LIBRARY_PATH", "folder", link, user, via=str(intruder_home))


def test_a_group_writable_folder_whose_group_holds_the_intruder_is_refused(user, tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chown(folder, 0, user.gid)
    folder.chmod(0o775)
    assert refusal({"PYTHONPATH": str(folder)}, "/")[0] == (
        f"the training's PYTHONPATH folder {folder} is writable by other users (mode 775), who could change what "
        "the ranks import as root")
    folder.chmod(0o755)
    assert refusal({"PYTHONPATH": str(folder)}, "/") is None


def test_an_empty_library_path_entry_is_the_start_folder(user, intruder_home):
    assert refusal({"LD_LIBRARY_PATH": "/usr/lib:"}, str(intruder_home))[0] == \
        refused_line("LD_LIBRARY_PATH", "folder", intruder_home, user)
    assert refusal({"LD_LIBRARY_PATH": "/usr/lib:"}, "/usr") is None


def test_the_tools_own_commands_get_no_loader_variable_and_the_password_databases_home():
    env = tool_env({"PATH": ":bin:/usr/bin", "LD_PRELOAD": "/x.so", "LD_AUDIT": "/x.so", "PYTHONPATH": "/x",
                    "PYTHONSTARTUP": "/x", "BASH_ENV": "/x", "ENV": "/x", "BASH_FUNC_ls%%": "() { id; }",
                    "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.fsmonitor", "GIT_CONFIG_VALUE_0": "id",
                    "XDG_CONFIG_HOME": "/home/other/.config", "GCONV_PATH": "/x", "OPENSSL_CONF": "/x",
                    "HOME": "/home/other", "LC_ALL": "C", "CUDA_VISIBLE_DEVICES": "0", "TERM": "xterm"})
    import pwd
    assert env == {"PATH": "/usr/bin", "LC_ALL": "C", "CUDA_VISIBLE_DEVICES": "0", "TERM": "xterm",
                   "HOME": pwd.getpwuid(os.geteuid()).pw_dir}


def test_a_pycache_prefix_with_a_planted_pyc_for_json_starts_no_rank(user, intruder_home, markers, tmp_path):
    """The issue's attack: --env PYTHONPYCACHEPREFIX=<a folder the intruder writes> holding
    json/__init__.cpython-3X.pyc (unchecked-hash: never compared to the source), which every rank
    imports in place of the standard json."""
    from .ports import free_port

    source = Path(json.__file__)
    pyc = Path(str(intruder_home) + str(source.parent)) / f"__init__.{sys.implementation.cache_tag}.pyc"
    user.run(["mkdir", "-p", str(pyc.parent)])
    planted = intruder_home / "planted.py"
    user.run(["sh", "-c", 'cat > "$1"', "sh", str(planted)],
             input=f"import os\nopen({str(markers)!r} + '/json-uid-' + str(os.getuid()), 'w').close()\n")
    user.run(["/usr/bin/python3", "-c", "import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], "
              "invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)", str(planted), str(pyc)])
    code = train_folder(tmp_path)
    done = subprocess.run(command("--no-probes", "--force", "--master-port", str(free_port()), "--launch",
                                  "--log-dir", str(tmp_path / "logs"), "--env", f"PYTHONPYCACHEPREFIX={intruder_home}",
                                  "--", "train.py"),
                          cwd=code, capture_output=True, text=True, timeout=300)

    assert left(markers) == []
    assert done.returncode == 1, done.stderr[-3000:]
    assert (f"ddp-preflight: training failed on {HOST}: "
            f"{refused_line('PYTHONPYCACHEPREFIX', 'folder', intruder_home, user, 'import')} (fix: give "
            "PYTHONPYCACHEPREFIX only folders that root alone can change, or leave it out); every node was stopped") \
        in done.stderr.splitlines(), done.stderr[-3000:]


def test_the_planted_pyc_does_run_under_that_prefix_so_the_marker_can_tell(user, intruder_home, markers):
    source = Path(json.__file__)
    pyc = Path(str(intruder_home) + str(source.parent)) / f"__init__.{sys.implementation.cache_tag}.pyc"
    user.run(["mkdir", "-p", str(pyc.parent)])
    planted = intruder_home / "planted.py"
    user.run(["sh", "-c", 'cat > "$1"', "sh", str(planted)],
             input=f"import os\nopen({str(markers)!r} + '/json-uid-' + str(os.getuid()), 'w').close()\n")
    user.run(["/usr/bin/python3", "-c", "import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], "
              "invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)", str(planted), str(pyc)])
    subprocess.run([sys.executable, "-c", "import json"], env={"PYTHONPYCACHEPREFIX": str(intruder_home)}, check=True)
    assert left(markers) == ["json-uid-0"]


# Exported bash functions (BASH_FUNC_NAME%%): every bash a rank starts defines them, and runs the
# body where a script calls NAME. Their words are read as bash reads them. (--env refuses such a
# name; they come from a node's own environment, which reaches the supervisor where /bin/sh is
# bash: RHEL. Here /bin/sh is dash, which drops them, so the rule is tried on its own.)

def planted_script(user, folder: Path, markers: Path) -> Path:
    script = folder / "x.sh"
    user.run(["sh", "-c", 'cat > "$1"; chmod 755 "$1"', "sh", str(script)],
             input=f"#!/bin/sh\ntouch {markers}/bash-uid-$(id -u)\n")
    return script


def test_the_function_does_run_the_script_in_bash_so_the_marker_can_tell(user, intruder_home, markers):
    script = planted_script(user, intruder_home, markers)
    subprocess.run(["bash", "-c", "ls"], env={"PATH": "/usr/bin:/bin", "BASH_FUNC_ls%%": f'() {{  "{script}"\n}}'},
                   check=True, timeout=60)
    assert left(markers) == ["bash-uid-0"]


@pytest.mark.parametrize("body", [
    '() {  "{x}" "$@"\n}', "() {  $(cat '{x}')\n}", '() {  eval "$({x} --go)"\n}', "() {  `{x}`\n}",
    "() {  a={x} command ls\n}", "() {  $TOOL\n}", "() {  ${TOOL:-ls} > /dev/null\n}", "() {  ls >{x}\n}",
])
def test_every_way_a_bash_function_names_the_intruders_file_is_refused(user, intruder_home, markers, body):
    script = planted_script(user, intruder_home, markers)
    env = {"BASH_FUNC_ls%%": body.replace("{x}", str(script)), "TOOL": str(script)}
    assert refusal(env, "/") == (refused_line("BASH_FUNC_ls%%", "path", script, user, "run"),
                                 "give BASH_FUNC_ls%% only paths that root alone can change, or leave it out")


def test_a_bash_function_of_roots_own_tools_passes():
    """Lmod's `module`, as /etc/profile.d exports it on a cluster."""
    lmod = '() {  eval "$($LMOD_CMD bash "$@")" && eval "$(${LMOD_SETTARG_CMD:-:} -s sh)"\n}'
    assert refusal({"BASH_FUNC_module%%": lmod, "LMOD_CMD": "/usr/bin/env"}, "/") is None
