"""Reading a file another user may have placed (a training folder, a data folder, a folder given
to explain, a config): a regular file only, never more than a cap, and nothing that waits. A FIFO
would block open() until someone writes to it (forever, and the reader with it); a device or a
socket is no file of a run; a file of 400 MB given where 4 KB are expected costs its size in
memory. Each is skipped with one phrase that says why (Skipped), never read.

The type is asked before opening (stat), so a device is never opened; the file is then opened
O_NONBLOCK (a FIFO swapped in meanwhile opens at once, and fstat tells) and, where the caller
says so, O_NOFOLLOW. Standard library only, Python 3.8+: the nodes' collectors use it, and the
master's readers."""

from __future__ import annotations

import errno
import os
import stat
from typing import Iterator, List, Optional, Tuple

MAX_DEPTH = 64              # folders below the top that a walk enters


class Skipped(OSError):
    """Not read, and why: "a FIFO, not a regular file", "over 64 MiB (400 MiB)"."""

    def __init__(self, why: str):
        super().__init__(0, why)

    def __str__(self) -> str:
        return str(self.strerror)


def open_regular(path: str, *, follow: bool = True, dir_fd: Optional[int] = None,
                 limit: Optional[int] = None) -> Tuple[int, os.stat_result]:
    """(a blocking descriptor, its fstat) of the regular file at `path`; Skipped when it is
    anything else (or over `limit` bytes), OSError when it cannot be opened."""
    st = os.stat(path, dir_fd=dir_fd, follow_symlinks=follow)
    _must_be_regular(st, limit)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if not follow and exc.errno == errno.ELOOP:     # swapped for a symlink since the stat
            raise Skipped("a symlink, not followed") from None
        raise
    try:
        st = os.fstat(fd)
        _must_be_regular(st, limit)
        os.set_blocking(fd, True)
        return fd, st
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str, limit: int, *, follow: bool = True, dir_fd: Optional[int] = None) -> bytes:
    """The whole regular file, when it holds at most `limit` bytes (it is read no further even if
    it grows meanwhile); Skipped or OSError otherwise."""
    fd, _ = open_regular(path, follow=follow, dir_fd=dir_fd, limit=limit)
    try:
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise Skipped(f"over {size_text(limit)} (it grew while read)")
    return b"".join(chunks)


def kind(mode: int) -> str:
    """What a file that is not a regular one is, in a phrase."""
    for test, words in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symlink"),
                        (stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):
        if test(mode):
            return words
    return "not a regular file"


def size_text(size: int) -> str:
    """Bytes as a person reads them: 1 TiB, 64 MiB, 400 MiB, 3 KiB, 12 bytes."""
    for shift, unit in ((40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")):
        if size >= 1 << shift:
            value = size / (1 << shift)
            return f"{value:.0f} {unit}" if value >= 10 or value == int(value) else f"{value:.1f} {unit}"
    return f"{size} bytes"


def _must_be_regular(st: os.stat_result, limit: Optional[int]) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise Skipped(f"{kind(st.st_mode)}, not a regular file")
    if limit is not None and st.st_size > limit:
        raise Skipped(f"over {size_text(limit)} ({size_text(st.st_size)})")


def walk(top: str, max_depth: int = MAX_DEPTH, too_deep: Optional[List[str]] = None
         ) -> Iterator[Tuple[str, List[str], List[str]]]:
    """os.walk's top-down (folder, its folders, its other names), each list sorted, without
    recursion (os.walk recurses before Python 3.12: a chain of 1,200 folders raised RecursionError)
    and entering no folder more than `max_depth` below `top`: those are added to `too_deep`. A
    symlink is never entered, and is among the other names (its caller reads it or not). As with
    os.walk, the caller may prune the folders list to skip them; a folder that cannot be listed is
    passed over."""
    stack = [(top, 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            with os.scandir(folder) as found:
                entries = list(found)
        except OSError:
            continue
        folders: list[str] = []
        names: list[str] = []
        for entry in entries:
            try:
                real_folder = entry.is_dir(follow_symlinks=False)
            except OSError:
                real_folder = False
            (folders if real_folder else names).append(entry.name)
        folders.sort()
        names.sort()
        yield folder, folders, names
        below = [os.path.join(folder, name) for name in folders]
        if depth >= max_depth:
            if too_deep is not None:
                too_deep.extend(below)
            continue
        stack.extend((path, depth + 1) for path in reversed(below))
