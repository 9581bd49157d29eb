"""Bytes from a node into lines, in linear time and bounded memory, whatever a program prints.

A rank's line longer than MAX_LINE is cut there and says how much was left out (a 200 MB line
without a newline costs 64 KiB, not gigabytes). Protocol lines (node/protocol.py) may be longer:
the facts of a node with a large shard manifest are one line. One that fails its signature (a
rank wrote it into its launcher's stdout) is text like any other, and is cut so (as_text) before
anything keeps or shows it."""

from __future__ import annotations

from node.protocol import PREFIX

MAX_LINE = 64 * 1024             # bytes of a program's own line that are kept
MAX_MARKED = 256 * 1024 * 1024   # bytes of a protocol line
_PREFIX = PREFIX.encode()


class LineSplitter:
    def __init__(self, max_line: int = MAX_LINE, max_marked: int = MAX_MARKED):
        self.max_line, self.max_marked = max_line, max_marked
        self._parts: list[bytes] = []
        self._kept = 0          # bytes in _parts
        self._dropped = 0       # bytes of the current line beyond its limit
        self._head = b""        # its first bytes: a protocol line has a higher limit

    def feed(self, data: bytes) -> list[str]:
        lines: list[str] = []
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                self._add(data[start:])
                return lines
            self._add(data[start:end])
            lines.append(self._take())
            start = end + 1

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
        room = (self.max_marked if marked else self.max_line) - self._kept
        if len(piece) > room:
            self._dropped += len(piece) - max(room, 0)
            piece = piece[:max(room, 0)]
        if piece:
            self._parts.append(piece)
            self._kept += len(piece)

    def _take(self) -> str:
        text = b"".join(self._parts).decode("utf-8", errors="replace")
        if self._dropped:
            text += f" [... {self._dropped} more bytes of this line left out]"
        self._parts, self._kept, self._dropped, self._head = [], 0, 0, b""
        return text


def as_text(line: str, max_line: int = MAX_LINE) -> str:
    """A line taken as a program's text, cut as a text line is (a marked line that failed its
    signature had the protocol's room): its first max_line characters and what was left out."""
    if len(line) <= max_line:
        return line
    return line[:max_line] + f" [... {len(line) - max_line} more characters of this line left out]"
