"""A second, unprivileged local user for the hostile-user tests (issue 23): a real account with a
home, made by the test as root (useradd), so that what it plants is owned by someone who is not
root and not the tool's user. The account is kept between runs (useradd once); nothing it owns
outside the tests' own folders is left behind by a test.

    user = hostile_user()             # Intruder(name, uid, gid, home)
    user.run(["sh", "-c", "..."])     # as that user, in its home, with its own environment
    user.folder(tmp_path / "x")       # a folder that user owns (0777 unless said otherwise)
    user.file(path, text, mode=0o755)  # a file that user owns
"""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

NAME = "ddpp-intruder"


@dataclass(frozen=True)
class Intruder:
    name: str
    uid: int
    gid: int
    home: Path

    def env(self) -> dict:
        return {"HOME": str(self.home), "USER": self.name, "LOGNAME": self.name,
                "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}

    def run(self, argv: list[str], *, check: bool = True, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        """argv as this user (no supplementary groups), in its home unless cwd is given."""
        kw.setdefault("cwd", str(self.home))
        kw.setdefault("env", self.env())
        return subprocess.run(argv, user=self.uid, group=self.gid, extra_groups=[], check=check,
                              timeout=timeout, capture_output=True, text=True, **kw)

    def popen(self, argv: list[str], **kw) -> subprocess.Popen:
        kw.setdefault("cwd", str(self.home))
        kw.setdefault("env", self.env())
        return subprocess.Popen(argv, user=self.uid, group=self.gid, extra_groups=[], **kw)

    def own(self, path: str | Path) -> Path:
        os.lchown(path, self.uid, self.gid)
        return Path(path)

    def folder(self, path: str | Path, mode: int = 0o777) -> Path:
        """A folder this user owns (its parents as they are)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, mode)
        return self.own(path)

    def file(self, path: str | Path, text: str, mode: int = 0o644) -> Path:
        """A file this user owns, with this text."""
        path = Path(path)
        path.write_text(text)
        os.chmod(path, mode)
        return self.own(path)


@functools.lru_cache(maxsize=1)
def hostile_user() -> Intruder:
    """The account, made once (root only)."""
    if os.geteuid() != 0:
        raise RuntimeError("the hostile-user tests make a second user: run them as root")
    try:
        entry = pwd.getpwnam(NAME)
    except KeyError:
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        subprocess.run([useradd, "--create-home", "--shell", "/bin/sh", "--user-group", NAME],
                       check=True, capture_output=True, timeout=60)
        entry = pwd.getpwnam(NAME)
    home = Path(entry.pw_dir)
    if not home.is_dir():
        home.mkdir(mode=0o755, parents=True)
        os.chown(home, entry.pw_uid, entry.pw_gid)
    return Intruder(NAME, entry.pw_uid, entry.pw_gid, home)


def world_writable(path: str | Path) -> Path:
    """A folder anyone may write (0777, not sticky), as careless shared folders are."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o777)
    return path
