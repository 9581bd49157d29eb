"""What the ranks can import from the training's code folder, walked whole: every module, compiled
module, extension and package below it, at any depth, and every folder a dotted import can
reach (a folder is a namespace package even without __init__.py; __pycache__'s .pyc files are
imported in place of the source). Standard library only, Python 3.8+.

A file or folder of these that another user owns or may write (a group that holds another user
and an ACL count, as for trust.walk) is refused: root's ranks would import what that user puts
there. What no import statement can name is not walked (a name that is not an identifier:
`.git`, `my-data`, `README.md`, `shard_000.bin`). A symlink is judged as trust.walk judges a
path (the link's folder and every folder to its target), and a linked folder is walked once.

Bounded: at most MOST_NAMES importable names kept and MOST_SECONDS spent listing, whatever the
folder holds; a walk that reaches its bound says so, and what it did not see is not taken as
checked."""

from __future__ import annotations

import os
import stat
import time
from importlib.machinery import all_suffixes
from typing import List, NamedTuple, Optional, Set, Tuple

from .trust import Refusal, _mode, walk
from .writers import others_may_write

MOST_NAMES = 100_000      # importable names below the code folder: far beyond a project's code
MOST_SECONDS = 10.0       # spent listing them (a slow network file system)
SUFFIXES = tuple(all_suffixes()) + (".pth",)


class Bound(NamedTuple):
    """The walk stopped before it saw everything: after `names` names, `seconds` in, at its
    bound of `most_names` names and `most_seconds` seconds."""
    names: int
    seconds: float
    most_names: int
    most_seconds: float


def importable(name: str, is_folder: bool) -> bool:
    """A name an import statement can reach: an identifier, as a folder (a package, a
    namespace package, __pycache__) or with a module's suffix."""
    if is_folder:
        return name.isidentifier()
    return name.split(".", 1)[0].isidentifier() and name.endswith(SUFFIXES)


def _refused(path: str, st: os.stat_result) -> Optional[Refusal]:
    """Why this entry (its folders above are judged already) may not be trusted, or None. A
    sticky folder here is no rescue: anyone may add the module that an import then finds."""
    me = os.geteuid()
    if st.st_uid not in (0, me):
        return Refusal(path, "owner", st.st_uid, f"{stat.S_IMODE(st.st_mode):o}")
    if not stat.S_ISLNK(st.st_mode) and others_may_write(st, path):
        return Refusal(path, "writable", st.st_uid, _mode(st, path))
    return None


def first_untrusted(folder: str, most_names: Optional[int] = None,
                    most_seconds: Optional[float] = None) -> "str | Bound | None":
    """The path of the first importable file or folder below `folder` (itself judged by the
    caller) that another user owns or may write, or that links to what they do, in name order,
    depth first; a Bound when the walk stopped before the end; None when all of it is trusted."""
    most_names = MOST_NAMES if most_names is None else most_names
    most_seconds = MOST_SECONDS if most_seconds is None else most_seconds
    start, seen = time.monotonic(), 0
    walked: Set[Tuple[int, int]] = set()
    stack: List[str] = [folder]
    while stack:
        here = stack.pop()
        try:
            here_st = os.stat(here)
            if (here_st.st_dev, here_st.st_ino) in walked:
                continue
            walked.add((here_st.st_dev, here_st.st_ino))
            importables = []
            with os.scandir(here) as listing:
                # Only what an import can name is kept (a folder of a million shards costs its
                # listing's time, bounded, not its memory) and counted.
                for entry in listing:
                    if time.monotonic() - start > most_seconds:
                        return Bound(seen, time.monotonic() - start, most_names, most_seconds)
                    try:
                        is_folder = entry.is_dir()          # a link to a folder is one to Python
                    except OSError:
                        continue
                    if importable(entry.name, is_folder):
                        seen += 1
                        if seen > most_names:
                            return Bound(seen - 1, time.monotonic() - start, most_names, most_seconds)
                        importables.append((entry.name, entry.path, is_folder))
        except OSError:
            continue            # unreadable here: Python cannot import from it either
        below: List[str] = []
        for _, path, is_folder in sorted(importables):
            try:
                st = os.lstat(path)
            except OSError:
                continue
            refused = _refused(path, st)
            if refused is None and stat.S_ISLNK(st.st_mode):
                refused = walk(path)                # every folder to its target, as written and resolved
            if refused is not None:
                return path
            if is_folder:
                below.append(path)
        stack.extend(reversed(below))
    return None
