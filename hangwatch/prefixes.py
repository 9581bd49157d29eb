"""Who wrote a line of output, as its prefixes say: ddp-preflight's launcher "[worker1 r3] " (a
node's own lines: "[worker1] "), torchrun's --tee "[default0]:", torch's "[rank3]: " on an uncaught
exception's lines. Pure, standard library only: every reader of a rank's output strips them here
(tracebacks.py, torchrun_table.py, `ddp-preflight explain`)."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Origin:
    """Who wrote a line, as its prefixes say (None: that prefix is absent)."""
    node: str | None = None          # ddp-preflight's launcher: "[worker1 r3] "; a node's own lines "[worker1] "
    rank: int | None = None          # the launcher's global rank ("r3")
    local_rank: int | None = None    # torchrun --tee's "[default1]:"
    marker: int | None = None        # torch's "[rank3]: " on an uncaught exception's lines and its C++ logs

    @property
    def writer(self) -> Origin:
        """The stream the line belongs to: its outermost prefix alone (torch's marker is on some of
        a rank's lines only, so it names the stream only where nothing else does)."""
        if self.node is not None:
            return Origin(node=self.node, rank=self.rank)
        if self.local_rank is not None:
            return Origin(local_rank=self.local_rank)
        return Origin(marker=self.marker)


LAUNCHER = re.compile(r"\[(?P<node>[^\]\s]+)(?: r(?P<rank>\d+))?\] ")
TEE = re.compile(r"\[(?P<role>[A-Za-z_][^\]\d]*)(?P<local>\d+)\]:")
MARKER = re.compile(r"\[rank(?P<rank>\d+)\]: ?")
ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def split_prefix(line: str) -> tuple[Origin, str]:
    """The line's prefixes (launcher's, then --tee's, then torch's marker) and its text: without
    them, its line ending, its colour codes, and what a carriage return wrote over."""
    text = line.rstrip("\r\n")
    node = rank = local = marker = None
    found = LAUNCHER.match(text)
    if found:
        node, rank = found["node"], int(found["rank"]) if found["rank"] else None
        text = text[found.end():]
    found = TEE.match(text)
    if found and found["role"] != "rank":
        local = int(found["local"])
        text = text[found.end():]
    if "\r" in text:
        text = text.rsplit("\r", 1)[1]          # a progress bar's updates: the terminal shows the last
    found = MARKER.match(text)
    if found:
        marker = int(found["rank"])
        text = text[found.end():]
    if "\x1b" in text:
        text = ESCAPES.sub("", text)
    return Origin(node, rank, local, marker), text


def strip_prefix(line: str) -> str:
    """The line as the rank wrote it: "[worker1 r3] [rank3]: Traceback ..." and
    "[default0]:[rank0]: Traceback ..." are "Traceback ..."."""
    return split_prefix(line)[1]
