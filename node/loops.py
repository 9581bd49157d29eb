"""Whether a line of a rank's Python code sits inside a loop (a `for` or `while` body, at any depth
of its function): what tells a rank asleep inside its training loop from one that left the loop
and sleeps after it. Read ON the node by the agent, from the file py-spy names, bounded (a FIFO or
a huge file there is not read), parsed once per (path, size, mtime).

Standard library only, Python 3.8+."""

from __future__ import annotations

import ast
import os
from typing import Dict, FrozenSet, Optional, Set, Tuple

from .bounded import read_regular

MOST_BYTES = 4 << 20          # a source file larger than this is not parsed
MOST_FILES = 256              # files remembered

_cache: Dict[Tuple[str, int, int], Optional[FrozenSet[int]]] = {}


def loop_lines(path: str) -> Optional[FrozenSet[int]]:
    """The line numbers inside a loop's body in this file; None when it cannot be read or parsed."""
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
        for node in ast.walk(tree):
            if isinstance(node, (ast.For, ast.While, ast.AsyncFor)):
                for stmt in node.body:
                    end = getattr(stmt, "end_lineno", None) or stmt.lineno
                    lines.update(range(stmt.lineno, end + 1))
        found = frozenset(lines)
    if len(_cache) >= MOST_FILES:
        _cache.clear()
    _cache[key] = found
    return found


def annotate(dump) -> None:
    """Mark each Python frame of a `py-spy dump --json` with "in_loop" (True or False) where its
    file could be read."""
    if not isinstance(dump, list):
        return
    for thread in dump:
        for frame in (thread.get("frames") or []) if isinstance(thread, dict) else []:
            path, line = frame.get("filename"), frame.get("line")
            if not isinstance(path, str) or not path.endswith(".py") or not isinstance(line, int):
                continue
            lines = loop_lines(path)
            if lines is not None:
                frame["in_loop"] = line in lines
