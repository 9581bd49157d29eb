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


# a node's name is never all digits: "[80746] " is a user's line number ("rank 0 on 80746")
LAUNCHER = re.compile(r"\[(?P<node>(?!\d+[\] ])[^\]\s]+)(?: r(?P<rank>\d+))?\] ")
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


@dataclass(frozen=True)
class Line:
    """A line as whoever wrote it meant it, whatever launchers, loggers and pastes added around it:
    its message and what the prefixes said (None: not said)."""
    text: str
    rank: int | None = None          # a global rank: torch's [rank3]:, srun --label's "3: ", mpirun's [1,3]<stderr>:
    local_rank: int | None = None    # torchrun --tee's [default1]:, srun's [host:1]: (a node's own numbering)
    host: str | None = None          # srun's [host:1]:, Ray's ip=, NCCL's host:pid:tid, ddp-preflight's [worker1]
    time: str | None = None          # a timestamp as printed (logging, glog, a log collector)


# What launchers, loggers and pastes put before a message, tried at the start of the line until none
# is left: each pattern's named groups are what it says. Kept narrow: a word of the message itself
# ("step 10: loss") must not read as one.
OUTER = tuple(re.compile(p) for p in (
    r"\s*> ?(?=.)",                                                         # a markdown quote (keeps what is indented in it)
    r"\*\*(?=\S)",                                                         # markdown bold
    r"\[\d{3,}\] (?=\[|\S)",                                               # a user's line numbers: [80746]
    r"(?:std(?:err|out)): ",                                               # accelerate test's stderr:
    r"\[1,(?P<rank>\d+)\]<std(?:err|out)>:",                               # mpirun --tag-output
    r"\((?:\w+) pid=\d+(?:, ip=(?P<host>[\d.:a-f]+))?\) ",                 # Ray's worker
    r"\[(?P<host>[A-Za-z][\w.-]*):(?P<local>\d+)\]:\s?",                   # srun --label with a host: [gpu187:1]:
    r"(?P<rank>\d{1,5}): (?=\S)",                                          # srun --label: "10: "
    r"\[RANK (?P<rank>\d+)\] ",                                            # a training script's own
    r"(?P<time>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?Z?) ?(?:\| ?)?",   # ISO timestamps, logging's
    r"\[(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?)\] ?",           # DeepSpeed's [2023-04-14 13:11:27,885]
    r"(?P<time>\d\d/\d\d/\d{4} \d\d:\d\d:\d\d)\s*-\s*",                     # logging's 05/10/2023 23:07:45 -
    r"\[\s*(?P<time>\d+\.\d+)\] ?",                                         # dmesg's [2059991.491436]
    r"(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\s*[|-]\s*[\w.]+\s*[|-]\s*",      # logging: INFO | module |
    r"(?:INFO|WARNING|ERROR|DEBUG|CRITICAL):[\w.]+:",                      # logging's basicConfig: ERROR:torch...:
    r"\[(?:INFO|WARNING|ERROR|DEBUG)\] ?(?:\[[\w.:]+\] ?)?",                # DeepSpeed's [ERROR] [launch.py:434:x]
    r"[EWIF](?P<time>\d{4} \d\d:\d\d:\d\d\.\d+)\s+\d+\s+\S+:\d+\] ?",        # glog: E1126 hh:mm:ss.uuuuuu pid file:line]
    # c10's [E1206 hh:mm:ss.n file:line] (torch 2.4+), [W x.cpp:721] (older)
    r"\[[EWIF](?:(?P<time>\d{3,4} \d\d:\d\d:\d\d\.\d+)\s+|\s)[\w./]+:\d+\] ?",
    r"\[c10d\]\s*",
    r"(?P<host>[A-Za-z][\w.-]*):\d+:\d+ \[\d+\] ",                          # NCCL's host:pid:tid [device]
))
RANK_SAID = re.compile(r"\[(?:PG [^\]]*?)?Rank (?P<rank>\d+)\]")            # the watchdog's own [Rank 3], [PG 1 Rank 3]


def normalize(line: str) -> Line:
    """The one reader of line prefixes for what users paste: ddp-preflight's, torchrun's and torch's
    (split_prefix), then srun's, mpirun's, Ray's, loggers' and timestamps, markdown, in any order
    and nesting, each read into what it says."""
    origin, text = split_prefix(line)
    rank = origin.rank if origin.rank is not None else origin.marker
    local, host, time = origin.local_rank, origin.node, None
    for _ in range(12):
        for pattern in OUTER:
            found = pattern.match(text)
            if found is None or found.end() == 0:
                continue
            said = found.groupdict()
            rank = int(said["rank"]) if said.get("rank") is not None and rank is None else rank
            local = int(said["local"]) if said.get("local") is not None and local is None else local
            host = said.get("host") or host
            time = said.get("time") or time
            text = text[found.end():]
            inner, text = _torch_prefixes(text)     # torch's [rank3]: after a logger's prefix
            rank = inner.marker if inner.marker is not None and rank is None else rank
            local = inner.local_rank if inner.local_rank is not None and local is None else local
            break
        else:
            break
    if rank is None and "Rank " in text[:160]:
        found = RANK_SAID.search(text[:160])
        rank = int(found["rank"]) if found else None
    return Line(text, rank, local, host, time)


def _torch_prefixes(text: str) -> tuple[Origin, str]:
    """torchrun's [default1]: and torch's [rank3]: where a logger put them after its own prefix."""
    local = marker = None
    found = TEE.match(text)
    if found and found["role"] != "rank":
        local, text = int(found["local"]), text[found.end():]
    found = MARKER.match(text)
    if found:
        marker, text = int(found["rank"]), text[found.end():]
    return Origin(local_rank=local, marker=marker), text
