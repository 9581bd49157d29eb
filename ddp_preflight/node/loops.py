"""Whether a line of a rank's Python code sits inside a loop (a `for` or `while` body, at any depth
of its function): what tells a rank asleep inside its training loop from one that left the loop
and sleeps after it. And what a line waits in when nothing of Python's runs under it: a lock's
`.acquire()` or a `with` on one (C code, no Python frame), which is all its Python frames need
to say where it waits. Read ON the node by the agent, from the file py-spy names, bounded (a FIFO
or a huge file there is not read), parsed once per (path, size, mtime). Only a word from a closed
set leaves the node, never the code's text.

Standard library only, Python 3.8+."""

from __future__ import annotations

import ast
import os
import re
from typing import Dict, FrozenSet, Optional, Set, Tuple

from .bounded import read_regular

MOST_BYTES = 4 << 20          # a source file larger than this is not parsed
MOST_FILES = 256              # files remembered

_STDLIB = re.compile(r"/lib/python3\.\d+/")     # the standard library's folder (hangwatch/classify.py's STDLIB)

LOCK = "lock"        # the line calls X.acquire(...) or enters `with X:` (X not a call): a lock's wait

_cache: Dict[Tuple[str, int, int], Optional[Tuple[FrozenSet[int], FrozenSet[int]]]] = {}


def loop_lines(path: str) -> Optional[FrozenSet[int]]:
    """The line numbers inside a loop's body in this file; None when it cannot be read or parsed."""
    parsed = _parsed(path)
    return None if parsed is None else parsed[0]


def lock_lines(path: str) -> Optional[FrozenSet[int]]:
    """The lines that wait on a lock if they wait at all: `X.acquire(...)` on the line (a call
    spanning lines counts on each), or `with X:` whose X is a name or an attribute (a lock object;
    `with open(...)` or `with torch.no_grad()` are calls); None when it cannot be read or parsed."""
    parsed = _parsed(path)
    return None if parsed is None else parsed[1]


def _parsed(path: str) -> Optional[Tuple[FrozenSet[int], FrozenSet[int]]]:
    try:
        if os.path.realpath(path).startswith(("/proc/", "/sys/", "/dev/")):
            return None         # a name a process chose for its code: never a kernel file that blocks a read
        st = os.stat(path)
    except OSError:
        return None
    key = (path, st.st_size, st.st_mtime_ns)
    if key in _cache:
        return _cache[key]
    try:
        tree = ast.parse(read_regular(path, MOST_BYTES).decode("utf-8", "replace"))
    except (OSError, SyntaxError, ValueError):
        found = None
    else:
        lines: Set[int] = set()
        locks: Set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.For, ast.While, ast.AsyncFor)):
                for stmt in node.body:
                    end = getattr(stmt, "end_lineno", None) or stmt.lineno
                    lines.update(range(stmt.lineno, end + 1))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "acquire":
                locks.update(range(node.lineno, (getattr(node, "end_lineno", None) or node.lineno) + 1))
            elif isinstance(node, ast.With):
                if any(isinstance(item.context_expr, (ast.Name, ast.Attribute)) for item in node.items):
                    locks.add(node.lineno)
        found = (frozenset(lines), frozenset(locks))
    if len(_cache) >= MOST_FILES:
        _cache.clear()
    _cache[key] = found
    return found


def installed(path: str) -> bool:
    """Installed code (a package's, the standard library's, a frozen module): never the training's
    own lines, the only ones whose loops and locks the watcher reads (hangwatch/classify.py's
    Frame.in_library). Not parsed: a rank importing torch stands in torch's largest files, and
    parsing one holds the agent's interpreter for up to a second (16 ranks starting on 2 cores:
    its samples stopped for 5 s and the watcher called the node lost)."""
    return "-packages/" in path or path.startswith("<frozen") or bool(_STDLIB.search(path))


def annotate(dump) -> None:
    """Mark each Python frame of the training's own code in a `py-spy dump --json` with "in_loop"
    (True or False) where its file could be read, and "waits_on": "lock" where its line waits on a
    lock if it waits."""
    if not isinstance(dump, list):
        return
    for thread in dump:
        for frame in (thread.get("frames") or []) if isinstance(thread, dict) else []:
            path, line = frame.get("filename"), frame.get("line")
            if not isinstance(path, str) or not path.endswith(".py") or not isinstance(line, int) or installed(path):
                continue
            parsed = _parsed(path)
            if parsed is not None:
                frame["in_loop"] = line in parsed[0]
                if line in parsed[1]:
                    frame["waits_on"] = LOCK
