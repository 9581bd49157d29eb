"""torchrun's `--tee` in bounded memory, whatever a rank prints. Standard library only.

torchrun copies each rank's log file to its own stdout a line at a time (tail_log.tail_logfile:
`fp.readline()`, then `f"{header}{line}"`): a rank that prints 256 MiB in one line held the launch
program at 1.2 GB (the line read, prefixed, encoded), 1 GiB at several GB. Here the file is read
in chunks; each line keeps its first MAX_LINE bytes, the rest of it is counted and dropped, and
the line says how much: `[... N more bytes of this line left out]` (the master's own cut, in
transport/lines.py, says it the same way). A line is written once it ends (torchrun's own wrote
what it found at the file's end, so a rank's block-buffered output came in pieces that the
master joins again); the file's last line when the rank is done.

The launch program puts it in torchrun's place before it runs torchrun (launch_runner.py's
bounded_tee); a torch whose tail cannot be replaced keeps its own. This module imports no torch."""

import os
import time

# Bytes of a rank's line kept: under transport/lines.py's MAX_LINE (64 KiB) by room for torchrun's
# prefix and the note, so that the master keeps the line whole and the count said is the rank's.
MAX_LINE = 63 * 1024
CHUNK = 64 * 1024         # bytes read at a time


class LineCutter:
    """Bytes into whole lines, each at most `max_line` bytes and the count of what was dropped."""

    def __init__(self, max_line: int = MAX_LINE):
        self.max_line = max_line
        self.kept = bytearray()
        self.dropped = 0

    def feed(self, data: bytes) -> list:
        lines: list = []
        start = 0
        while True:
            end = data.find(b"\n", start)
            piece = data[start:] if end < 0 else data[start:end]
            room = self.max_line - len(self.kept)
            if len(piece) > room:
                self.dropped += len(piece) - room
                piece = piece[:room]
            self.kept += piece
            if end < 0:
                return lines
            lines.append(self.take())
            start = end + 1

    def rest(self) -> list:
        return [self.take()] if self.kept or self.dropped else []

    def take(self) -> str:
        text = bytes(self.kept).decode("utf-8", errors="replace")
        if self.dropped:
            text += " [... %d more bytes of this line left out]" % self.dropped
        self.kept, self.dropped = bytearray(), 0
        return text


def tail_logfile(header, file, dst, finished, interval_sec, log_line_filter=None, **_):
    """torchrun's tail_logfile (same arguments), in bounded memory."""
    while not os.path.exists(file):
        if finished.is_set():
            return
        time.sleep(interval_sec)
    cutter = LineCutter()

    def write(lines):
        for line in lines:
            if log_line_filter is None or log_line_filter(line + "\n"):
                dst.write("%s%s\n" % (header, line))

    with open(file, "rb") as fp:
        while True:
            data = fp.read(CHUNK)
            if data:
                write(cutter.feed(data))
            elif finished.is_set():
                write(cutter.rest())
                return
            else:
                time.sleep(interval_sec)
