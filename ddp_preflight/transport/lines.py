"""Bytes from a node into lines, in linear time and bounded memory, whatever a program prints.

A rank's line longer than MAX_LINE is cut there and says how much was left out (a 200 MB line
without a newline costs 64 KiB, not gigabytes). Protocol lines (node/protocol.py) may be longer:
the facts of a node with a large shard manifest are one line. But a rank can write a line that
starts like one into its launcher's stdout, so a marked line gets more room than MAX_LINE only
once the program announced it in a signed LONG line of its own, which its reader verified
(allow()): a forged one is cut at MAX_LINE while it is read, never held whole. One that fails
its signature is text like any other, and is cut so (as_text) before anything keeps or shows it."""

from __future__ import annotations

import re
from typing import Iterator

from ddp_preflight.node.protocol import PREFIX

MAX_LINE = 64 * 1024             # bytes of a program's own line that are kept
MAX_MARKED = 256 * 1024 * 1024   # bytes of a protocol line
_PREFIX = PREFIX.encode()


class LineSplitter:
    """`max_marked`: the room of a marked line; a reader that verifies announcements gives
    MAX_LINE here and lets a longer one through with allow()."""

    def __init__(self, max_line: int = MAX_LINE, max_marked: int = MAX_MARKED):
        self.max_line, self.max_marked = max_line, max_marked
        self._allowed = 0       # room of the next marked line, announced (allow)
        self._parts: list[bytes] = []
        self._kept = 0          # bytes in _parts
        self._dropped = 0       # bytes of the current line beyond its limit
        self._head = b""        # its first bytes: a protocol line has a higher limit

    def feed(self, data: bytes) -> list[str]:
        return list(self.each(data))

    def each(self, data: bytes) -> Iterator[str]:
        """feed() one line at a time: what the caller does with a line (allow()) holds for the
        bytes after it in the same chunk."""
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                self._add(data[start:])
                return
            self._add(data[start:end])
            yield self._take()
            start = end + 1

    def allow(self, size: int) -> None:
        """The next marked line may keep `size` bytes (at most MAX_MARKED): its program said so
        in a line whose signature its reader checked."""
        self._allowed = min(max(size, 0), MAX_MARKED)

    def end(self) -> list[str]:
        """The last line, if the stream ended without a newline."""
        return [self._take()] if self._parts or self._dropped else []

    def _add(self, piece: bytes) -> None:
        if not piece:
            return
        if self._dropped:
            self._dropped += len(piece)
            return
        if len(self._head) < len(_PREFIX):
            self._head = (self._head + piece)[:len(_PREFIX)]
        marked = len(self._head) == len(_PREFIX) and self._head == _PREFIX or \
            len(self._head) < len(_PREFIX) and _PREFIX.startswith(self._head)
        room = (max(self.max_marked, self._allowed) if marked else self.max_line) - self._kept
        if len(piece) > room:
            self._dropped += len(piece) - max(room, 0)
            piece = piece[:max(room, 0)]
        if piece:
            self._parts.append(piece)
            self._kept += len(piece)

    def _take(self) -> str:
        if self._head == _PREFIX:
            self._allowed = 0           # spent by this marked line, whoever wrote it
        text = b"".join(self._parts).decode("utf-8", errors="replace")
        if self._dropped:
            text += f" [... {self._dropped} more bytes of this line left out]"
        self._parts, self._kept, self._dropped, self._head = [], 0, 0, b""
        return text


_CUT = re.compile(r" \[\.\.\. \d+ more bytes of this line left out\]\Z")


def as_text(line: str, max_line: int = MAX_LINE) -> str:
    """A line taken as a program's text, cut as a text line is (a marked line that failed its
    signature may have had an announced line's room): its first max_line characters and what
    was left out. One the reading cut already (it says so) stays as it is."""
    cut = _CUT.search(line)
    if len(line) <= max_line or cut is not None and cut.start() <= max_line:
        return line
    return line[:max_line] + f" [... {len(line) - max_line} more characters of this line left out]"
