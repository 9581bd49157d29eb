"""What installing puts into site-packages: one import package of this project's own,
ddp_preflight, and no generic top-level names (cli, node, lab, ...) that collide with other packages;
its commands reach their functions, and `python -m ddp_preflight` is `ddp-preflight`."""

from __future__ import annotations

import configparser
import importlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).parents[2]
PACKAGE = "ddp_preflight"
BUILD = "import sys; from setuptools import build_meta; build_meta.build_wheel(sys.argv[1])"


def test_a_wheel_holds_one_import_package_whole_and_commands_that_reach_it(tmp_path):
    # Built from a copy of what a wheel is made of, so the build leaves nothing in the work tree.
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / PACKAGE, tmp_path / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-c", BUILD, str(tmp_path / "dist")], cwd=tmp_path, check=True, timeout=300,
                   capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if ".dist-info/" not in n} == {PACKAGE}
    assert {n for n in names if ".dist-info/" not in n} == {
        p.relative_to(tmp_path).as_posix() for p in (tmp_path / PACKAGE).rglob("*") if p.is_file()}
    scripts = configparser.ConfigParser()
    scripts.read_string(zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode())
    commands = dict(scripts["console_scripts"])
    assert sorted(commands) == ["ddp-preflight", "hangwatch"]
    for target in commands.values():
        module, _, function = target.partition(":")
        assert module.startswith(PACKAGE + ".") and callable(getattr(importlib.import_module(module), function))


def test_python_m_the_package_is_the_ddp_preflight_command():
    done = subprocess.run([sys.executable, "-m", PACKAGE, "--version"], capture_output=True, text=True, timeout=60,
                          cwd=REPO)
    assert done.returncode == 0 and done.stdout.startswith("ddp-preflight "), done.stderr
