"""The training code's revision: git commit plus a hash of uncommitted changes, or a hash of
the source files where there is no git.

The folder may be another user's: each file is read bounded (node/bounded.py), so a FIFO named
train_helpers.py is skipped with a note instead of blocking the collector forever; a symlink is
hashed by what it says (as git does), never followed; the folder is walked without recursion and
no deeper than node/bounded.py's MAX_DEPTH (a chain of 1,200 folders made os.walk raise
RecursionError), the first folder not entered named in `skipped`."""

from __future__ import annotations

import hashlib
import os

from ..bounded import MAX_DEPTH, Skipped, open_regular, walk
from .util import command

SOURCE_SUFFIXES = (".py", ".toml", ".cfg", ".yaml", ".yml", ".json", ".txt", ".sh")
MAX_FILES = 5000
FILE_BYTES = 16 << 20       # read of one file; a larger one is hashed by its first 16 MiB and its size
TOTAL_BYTES = 512 << 20     # read in all; the files after that are hashed by their name and size


def code_facts(code_dir: str | None) -> dict | None:
    if not code_dir:
        return None
    path = os.path.abspath(os.path.expanduser(code_dir))
    if not os.path.isdir(path):
        return {"error": f"code folder {path} does not exist here", "missing": True, "dir": path}
    top = command(["git", "-C", path, "rev-parse", "--show-toplevel"])
    skipped: dict = {}
    if top is not None and top.returncode == 0:
        out = _git(path, top.stdout.strip(), skipped)
    else:
        out = {"dir": path, "git": False, "tree_hash": _tree_hash(path, skipped)}
    if skipped:
        out["skipped"] = skipped        # name -> why it was not read ("a FIFO, not a regular file")
    return out


def _git(path: str, top: str, skipped: dict) -> dict:
    head = command(["git", "-C", path, "rev-parse", "HEAD"])
    commit = head.stdout.strip() if head and head.returncode == 0 else None
    status = command(["git", "-C", path, "status", "--porcelain", "--untracked-files=all", "--", "."])
    changed = [line[3:] for line in (status.stdout if status else "").splitlines()]
    digest = hashlib.sha256()
    diff = command(["git", "-C", path, "diff", "HEAD", "--binary", "--", "."])
    digest.update((diff.stdout if diff else "").encode())
    budget = [TOTAL_BYTES]
    for line in (status.stdout if status else "").splitlines():
        if line.startswith("??"):
            _hash_file(digest, line[3:], os.path.join(top, line[3:]), budget, skipped)
    return {"dir": path, "git": True, "commit": commit, "dirty": bool(changed),
            "changed_files": changed[:20], "changed_count": len(changed),
            "changes_hash": digest.hexdigest()[:16] if changed else None}


def _hash_file(digest, label: str, file: str, budget: list, skipped: dict) -> None:
    """The file's name and bytes into the digest: at most FILE_BYTES of it and what is left of
    the budget (then its size stands for the rest). What is not a regular file is named in
    `skipped` and counts by its kind, the same on every node."""
    digest.update(label.encode())
    try:
        fd, st = open_regular(file, follow=False)
    except Skipped as exc:
        if str(exc).startswith("a symlink"):
            try:
                digest.update(b"symlink:" + os.fsencode(os.readlink(file)))
                return
            except OSError:
                pass
        skipped[label] = str(exc)
        digest.update(f"skipped: {exc}".encode())
        return
    except OSError:
        return
    with os.fdopen(fd, "rb") as f:
        left = min(FILE_BYTES, budget[0], st.st_size)
        if left < st.st_size:
            digest.update(f"size {st.st_size}".encode())
        while left > 0:
            block = f.read(min(1 << 20, left))
            if not block:
                break
            digest.update(block)
            left -= len(block)
            budget[0] -= len(block)


def _tree_hash(path: str, skipped: dict) -> str:
    digest = hashlib.sha256()
    count = 0
    budget = [TOTAL_BYTES]
    too_deep: list = []
    for root, dirs, files in walk(path, too_deep=too_deep):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
        for name in files:
            if name.endswith(SOURCE_SUFFIXES):
                full = os.path.join(root, name)
                _hash_file(digest, os.path.relpath(full, path), full, budget, skipped)
                count += 1
                if count >= MAX_FILES:
                    return digest.hexdigest()[:16]
    if too_deep:              # said, and counted in the hash: the same on every node
        more = f" (and {len(too_deep) - 1} more)" if len(too_deep) > 1 else ""
        label = os.path.relpath(too_deep[0], path)
        skipped[label] = f"a folder deeper than {MAX_DEPTH} levels, not entered{more}"
        digest.update(f"{label}: {skipped[label]}".encode())
    return digest.hexdigest()[:16]
