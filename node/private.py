"""Folders and files that only their user can read or change: what a run keeps (its ranks'
output, its plan, hangwatch's bundles with command lines and environments) is nobody else's on a
shared machine, and nothing run or read as one user may be where another user placed it first.

A folder made here is 0700 (an existing one is the user's, and keeps its mode); a file written
here is 0600, also when an earlier run left it wider, and is never written through a symlink."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TextIO

FOLDER_MODE = 0o700
FILE_MODE = 0o600


def make_folder(path: str | Path) -> Path:
    """The folder, created private with its missing parents when it is not there."""
    path = Path(path)
    path.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)
    return path


def open_file(path: str | Path, append: bool = False) -> TextIO:
    """A private text file, line-buffered: a line is on disk (or failed) when write() returns."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(path, flags, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        return os.fdopen(fd, "a" if append else "w", buffering=1, encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def write_file(path: str | Path, text: str) -> None:
    with open_file(path) as f:
        f.write(text)


# -- what may be trusted: nothing another user could have placed or changed ---------------------

def not_trusted(path: str) -> str | None:
    """Why this user must not run or read as its own `path` (a real path: no symlink in it), or
    None. The file and its folder must be owned by root or this user and writable by no one else;
    so must every folder above, except sticky ones such as /tmp, where only an entry's owner can
    move it."""
    me = os.geteuid()
    folder = os.path.dirname(path)
    for where in [path] + folders_up(folder):
        try:
            st = os.lstat(where)
        except OSError as exc:
            return f"{where}: {exc.strerror}"
        if where == path and not stat.S_ISREG(st.st_mode):
            return f"{path} is not a regular file"
        if where != path and not stat.S_ISDIR(st.st_mode):
            return f"{where} is not a folder (it changed while being checked)"
        if st.st_uid not in (0, me):
            return f"{where} belongs to uid {st.st_uid}, not to root or this user (uid {me})"
        sticky = where not in (path, folder) and st.st_mode & stat.S_ISVTX
        if others_may_write(st) and not sticky:
            return f"{where} is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def others_may_write(st: os.stat_result) -> bool:
    """Anyone but the owner may write it. Group write counts only if the group holds someone else:
    with a user's private group (umask 002: Fedora, RHEL) only the owner is in it."""
    if st.st_mode & 0o002:
        return True
    if not st.st_mode & 0o020:
        return False
    import grp
    import pwd
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
        members = set(grp.getgrgid(st.st_gid).gr_mem)
    except KeyError:          # an owner or group with no name here: cannot tell who is in it
        return True
    return bool(members - {owner}) or any(p.pw_gid == st.st_gid and p.pw_uid != st.st_uid for p in pwd.getpwall())


def folders_up(folder: str) -> list[str]:
    """folder and every folder above it, up to /."""
    out = [folder]
    while out[-1] != os.path.dirname(out[-1]):
        out.append(os.path.dirname(out[-1]))
    return out


def own_private_folder(path: str, uid: int) -> str | None:
    """Why `path` is not `uid`'s private folder (a real folder, not a symlink, theirs, writable by
    no one else), or None. Made here (0700) when it is not there and `uid` is this process's."""
    if uid == os.geteuid():
        try:
            os.mkdir(path, FOLDER_MODE)
        except FileExistsError:
            pass
        except OSError as exc:
            return f"cannot make {path}: {exc.strerror}"
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a folder but {'a symlink' if stat.S_ISLNK(st.st_mode) else 'a file'}"
    if st.st_uid != uid:
        whose = f"this user (uid {uid})" if uid == os.geteuid() else f"uid {uid}"
        return f"{path} belongs to uid {st.st_uid}, not to {whose}"
    if st.st_mode & 0o022:
        return f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None
