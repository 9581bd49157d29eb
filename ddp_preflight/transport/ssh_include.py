"""OpenSSH's `Include`, read as `ssh -F FILE` reads it (paramiko's parser keeps the keyword and
reads nothing): each file or glob (sorted) is read in place of the line; a path that is not
absolute is under ~/.ssh for a user's config (one given with -F is one) and /etc/ssh for the
system's; a glob that matches nothing is no error; nesting stops at OpenSSH's 16 levels. An
Include inside a Host or Match block is read there, and that block goes on after it (OpenSSH
restores the block's state after the included file), so its header is repeated after the file."""

from __future__ import annotations

import glob
import os
import re
import shlex
from collections.abc import Callable

MAX_DEPTH = 16                  # OpenSSH's READCONF_MAX_DEPTH
SYSTEM_CONFIG = "/etc/ssh/ssh_config"
_INCLUDE = re.compile(r"^\s*include(?:\s*=\s*|\s+)(.*?)\s*$", re.IGNORECASE)
_BLOCK = re.compile(r"^\s*(?:host|match)(?:\s*=\s*|\s+)\S", re.IGNORECASE)


class IncludeError(Exception):
    """An Include that OpenSSH would refuse too: one line."""


def included_paths(value: str, system: bool) -> list[str]:
    """The files one Include line names, in the order ssh reads them."""
    try:
        words = shlex.split(value)
    except ValueError:
        raise IncludeError(f"Include {value}: unbalanced quotes") from None
    paths: list[str] = []
    for word in words:
        path = os.path.expanduser(word)
        if not os.path.isabs(path):
            path = os.path.join("/etc/ssh" if system else os.path.expanduser("~/.ssh"), path)
        paths += sorted(glob.glob(path)) if glob.has_magic(path) else [path]
    return paths


def expand(path: str, read: Callable[[str], str], depth: int = 0) -> tuple[str, list[str]]:
    """The config at `path` with every Include read in place, and every file read (`path` first).
    `read(path)` returns a file's text (the caller bounds and checks it) or raises OSError; an
    included file that cannot be read is skipped, as ssh skips a missing one."""
    if depth > MAX_DEPTH:
        raise IncludeError(f"{path}: Include nested deeper than {MAX_DEPTH} levels (does it include itself?)")
    system = os.path.realpath(path) == os.path.realpath(SYSTEM_CONFIG)
    out: list[str] = []
    files = [path]
    header: str | None = None
    for line in read(path).splitlines():
        include = _INCLUDE.match(line)
        if not include:
            if _BLOCK.match(line):
                header = line
            out.append(line)
            continue
        for name in included_paths(include.group(1), system):
            try:
                text, more = expand(name, read, depth + 1)
            except OSError:
                continue
            out.append(text)
            files += more
        if header is not None:
            out.append(header)          # the enclosing block goes on after the included file
    return "\n".join(out), files
