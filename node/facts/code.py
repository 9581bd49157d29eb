"""The training code's revision: git commit plus a hash of uncommitted changes, or a hash of
the source files where there is no git."""

from __future__ import annotations

import hashlib
import os

from .util import command

SOURCE_SUFFIXES = (".py", ".toml", ".cfg", ".yaml", ".yml", ".json", ".txt", ".sh")
MAX_FILES = 5000


def code_facts(code_dir: str | None) -> dict | None:
    if not code_dir:
        return None
    path = os.path.abspath(os.path.expanduser(code_dir))
    if not os.path.isdir(path):
        return {"error": f"code folder {path} does not exist here", "missing": True, "dir": path}
    top = command(["git", "-C", path, "rev-parse", "--show-toplevel"])
    if top is not None and top.returncode == 0:
        return _git(path, top.stdout.strip())
    return {"dir": path, "git": False, "tree_hash": _tree_hash(path)}


def _git(path: str, top: str) -> dict:
    head = command(["git", "-C", path, "rev-parse", "HEAD"])
    commit = head.stdout.strip() if head and head.returncode == 0 else None
    status = command(["git", "-C", path, "status", "--porcelain", "--untracked-files=all", "--", "."])
    changed = [line[3:] for line in (status.stdout if status else "").splitlines()]
    digest = hashlib.sha256()
    diff = command(["git", "-C", path, "diff", "HEAD", "--binary", "--", "."])
    digest.update((diff.stdout if diff else "").encode())
    for line in (status.stdout if status else "").splitlines():
        if line.startswith("??"):
            _hash_file(digest, line[3:], os.path.join(top, line[3:]))
    return {"dir": path, "git": True, "commit": commit, "dirty": bool(changed),
            "changed_files": changed[:20], "changed_count": len(changed),
            "changes_hash": digest.hexdigest()[:16] if changed else None}


def _hash_file(digest, label: str, file: str) -> None:
    digest.update(label.encode())
    try:
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        pass


def _tree_hash(path: str) -> str:
    digest = hashlib.sha256()
    count = 0
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        for name in sorted(files):
            if name.endswith(SOURCE_SUFFIXES):
                full = os.path.join(root, name)
                _hash_file(digest, os.path.relpath(full, path), full)
                count += 1
                if count >= MAX_FILES:
                    return digest.hexdigest()[:16]
    return digest.hexdigest()[:16]
