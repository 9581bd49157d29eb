"""Folders and files that only their user can read or change: what a run keeps (its ranks'
output, its plan, hangwatch's bundles with command lines and environments) is nobody else's on a
shared machine, and nothing run or read as one user may be where another user placed it first.

A folder made here is 0700 (an existing one is the user's, and keeps its mode); a file written
here is 0600, also when an earlier run left it wider.

Nothing is written through a link another user could have planted or swapped in: a path is
walked one folder at a time from / (openat with O_NOFOLLOW|O_DIRECTORY, mkdirat for the missing
ones), following a symlink only when no one but root or this user can have made or changed it
(its own owner and its folder's), and a file is opened relative to its folder's descriptor. The
folder a file goes in must be root's or this user's, writable by no one else (sticky /tmp
aside): another user's folder is refused in one line that names it and its owner. A folder held
(hold()) stays open for the process: every later path under it is walked from its descriptor, so
a symlink swapped in above it mid-run redirects nothing."""

from __future__ import annotations

import errno
import os
import stat
import threading
from pathlib import Path
from typing import Dict, List, Optional, TextIO, Tuple

from .writers import others_may_write, writable_mode

FOLDER_MODE = 0o700
FILE_MODE = 0o600
MAX_LINKS = 40        # symlinks followed on one path (the kernel's own limit)
# O_PATH: a folder on the way may be one this user can enter but not list (0711), as a path can.
_DIRECTORY = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(OSError):
    """A folder or file this user must not write through, in one phrase that names it and who
    could change it. An OSError, so that every caller that says why a write failed says this."""

    def __init__(self, message: str):
        super().__init__(errno.EPERM, message)

    def __str__(self) -> str:
        return str(self.strerror)


def user_name(uid: int) -> str:
    """'name (uid N)', for a message."""
    import pwd
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


class Folder:
    """A folder held open by its descriptor: what is made or written in it is made relative to
    that descriptor, wherever the folder is moved and whatever is put on the way to it later."""

    def __init__(self, fd: int, path: str):
        self.fd, self.path = fd, path

    def __enter__(self) -> "Folder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def new_folder(self, name: str) -> "Folder":
        """A folder made now (FileExistsError when the name is taken): nobody's but ours."""
        _plain(name)
        os.mkdir(name, FOLDER_MODE, dir_fd=self.fd)
        path = _join(self.path, name)
        return Folder(_open_made(self.fd, path, name), path)

    def open_file(self, name: str, append: bool = False) -> TextIO:
        """A private text file in this folder, line-buffered: a line is on disk (or failed) when
        write() returns. Never through a symlink, never a FIFO's reader or another user's file."""
        _plain(name)
        path = _join(self.path, name)
        flags = (os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
                 | (os.O_APPEND if append else 0))
        try:
            fd = os.open(name, flags, FILE_MODE, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EOPNOTSUPP):   # a symlink, a FIFO, a socket
                raise Refused(f"{path} is {_what(self.fd, name)}: not written") from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
                kind = _kind(st.st_mode)
                links = f" with {st.st_nlink} names" if stat.S_ISREG(st.st_mode) and st.st_nlink != 1 else ""
                raise Refused(f"{path} is {kind} of {user_name(st.st_uid)}{links}: not written")
            os.fchmod(fd, FILE_MODE)
            if not append:
                os.ftruncate(fd, 0)     # only now: the checks came before anything was cut
            os.set_blocking(fd, True)
            return os.fdopen(fd, "a" if append else "w", buffering=1, encoding="utf-8")
        except BaseException:
            os.close(fd)
            raise

    def write_file(self, name: str, text: str) -> None:
        with self.open_file(name) as f:
            f.write(text)


def folder(path: "str | Path", make: bool = True) -> Folder:
    """The folder at `path`, open (close it, or use `with`): made private with its missing parents
    when `make`; walked from the nearest held folder above it, or from /. Raises Refused for a
    link another user could have placed on the way, or a folder another user owns or may write."""
    where = os.path.abspath(os.fspath(path))      # lexical: a ".." is the name's, never a link's
    start, at, rest = _start(where)
    found = _walk(start, at, rest, make)
    try:
        _check_writable_by_us_alone(found)
    except BaseException:
        found.close()
        raise
    return found


_held: Dict[str, Folder] = {}
_held_lock = threading.RLock()


def hold(path: "str | Path") -> Folder:
    """The folder (as folder()), kept open for the rest of this process: every later path under
    it (its files, incidents/ of a run) is walked from it. Not to be closed by the caller."""
    where = os.path.abspath(os.fspath(path))
    with _held_lock:
        kept = _held.get(where)
        if kept is None:
            kept = _held[where] = folder(where)
        return kept


def why_refused(path: "str | Path") -> Optional[str]:
    """Why this user would not write in `path` (the phrase of Refused), or None; nothing is made:
    the part that exists is walked, for an error said before anything starts."""
    try:
        with folder(path, make=False):
            return None
    except Refused as exc:
        return str(exc)
    except OSError:
        return None         # missing (made later), unreadable: said when it is written


def make_folder(path: "str | Path") -> Path:
    """The folder, created private with its missing parents when it is not there."""
    with folder(path):
        return Path(path)


def open_file(path: "str | Path", append: bool = False) -> TextIO:
    """A private text file (Folder.open_file), in its folder walked as folder() does."""
    parent, name = os.path.split(os.path.abspath(os.fspath(path)))
    with folder(parent, make=False) as place:
        return place.open_file(name, append)


def write_file(path: "str | Path", text: str) -> None:
    with open_file(path) as f:
        f.write(text)


# -- the walk -------------------------------------------------------------------------------------

def _start(where: str) -> Tuple[int, str, List[str]]:
    """(a descriptor to start from, its path, the names left): the nearest held folder above."""
    with _held_lock:
        above = [p for p in _held if where == p or where.startswith(p.rstrip("/") + "/")]
        if above:
            base = max(above, key=len)
            return os.dup(_held[base].fd), base, [n for n in where[len(base):].split("/") if n]
    return os.open("/", _DIRECTORY), "/", [n for n in where.split("/") if n]


def _walk(fd: int, at: str, names: List[str], make: bool) -> Folder:
    """Walk `names` from the folder `fd` (at `at`; the descriptor is ours and is consumed)."""
    pending, links = list(names), 0
    try:
        while pending:
            name = pending.pop(0)
            if name in ("", "."):
                continue
            if name == "..":
                fd = _replace(fd, os.open("..", _DIRECTORY, dir_fd=fd))
                at = os.path.dirname(at) or "/"
                continue
            path = _join(at, name)
            try:
                fd = _replace(fd, os.open(name, _DIRECTORY, dir_fd=fd))
            except FileNotFoundError:
                if not make:
                    raise
                try:
                    os.mkdir(name, FOLDER_MODE, dir_fd=fd)
                except FileExistsError:
                    pass            # made meanwhile by someone: opened and checked as any other
                fd = _replace(fd, _open_made(fd, path, name))
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                target = _trusted_link(fd, path, name)
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, f"{path}: too many symlinks") from None
                pending[:0] = [n for n in target.split("/") if n]
                if target.startswith("/"):
                    fd, at = _replace(fd, os.open("/", _DIRECTORY)), "/"
                continue
            at = path
        return Folder(fd, at)
    except BaseException:
        os.close(fd)
        raise


def _open_made(parent: int, path: str, name: str) -> int:
    """The folder just made (0700) in `parent`, opened: it must be ours, or someone swapped it."""
    fd = os.open(name, _DIRECTORY, dir_fd=parent)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        os.close(fd)
        raise Refused(f"{path} was replaced by a folder of {user_name(st.st_uid)} while it was made")
    return fd


def _replace(old: int, new: int) -> int:
    os.close(old)
    return new


def _trusted_link(fd: int, path: str, name: str) -> str:
    """The target of the symlink `name` in the folder `fd`, when neither it nor its folder can
    have been made or changed by anyone but root or this user; Refused otherwise."""
    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    if not stat.S_ISLNK(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, f"{path} is {_kind(st.st_mode)}, not a folder")
    here = os.fstat(fd)
    mine = (0, os.geteuid())
    if st.st_uid not in mine:
        raise Refused(f"{path} is a symlink of {user_name(st.st_uid)}: not followed")
    if here.st_uid not in mine:
        raise Refused(f"{path} is a symlink in a folder of {user_name(here.st_uid)}, who can change it: not followed")
    if others_may_write(here, fd) and not here.st_mode & stat.S_ISVTX:
        raise Refused(f"{path} is a symlink in a folder other users can write (mode "
                      f"{writable_mode(here, fd)}): not followed")
    return os.readlink(name, dir_fd=fd)


def _check_writable_by_us_alone(found: Folder) -> None:
    """The folder files go in: root's or this user's, and no one else may put a name in it (a
    sticky one such as /tmp aside: there each file is checked as it is opened)."""
    st = os.fstat(found.fd)
    if st.st_uid not in (0, os.geteuid()):
        raise Refused(f"{found.path} belongs to {user_name(st.st_uid)}, who could replace what is written there")
    if others_may_write(st, found.fd) and not st.st_mode & stat.S_ISVTX:
        raise Refused(f"{found.path} is writable by other users (mode {writable_mode(st, found.fd)})")


def _plain(name: str) -> None:
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"not a plain file name: {name!r}")


def _join(at: str, name: str) -> str:
    return at.rstrip("/") + "/" + name


def _what(fd: int, name: str) -> str:
    try:
        return _kind(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        return "not a regular file"


def _kind(mode: int) -> str:
    for test, words in ((stat.S_ISREG, "a file"), (stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO"),
                        (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a device"),
                        (stat.S_ISBLK, "a device")):
        if test(mode):
            return words
    return "not a regular file"


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
        if others_may_write(st, where) and not sticky:
            return f"{where} is writable by other users (mode {writable_mode(st, where)})"
    return None


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
    if st.st_mode & 0o022 or others_may_write(st, path):
        return f"{path} is writable by other users (mode {writable_mode(st, path)})"
    return None
