"""Folders and files that only their user can read: what a run keeps (its ranks' output, its plan,
hangwatch's bundles with command lines and environments) is nobody else's on a shared machine.

A folder made here is 0700 (an existing one is the user's, and keeps its mode); a file written
here is 0600, also when an earlier run left it wider, and is never written through a symlink."""

from __future__ import annotations

import os
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
