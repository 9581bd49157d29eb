"""One log (a node's torchrun output, a launch's node log, a rank's own file, a Slurm job's
output), streamed: each writer's exceptions (hangwatch/tracebacks.py's Reader, by the lines'
prefixes), torchrun's summary table, NCCL's watchdog, torchrun's usage error and the OOM killer
(hangwatch/failures.py), each with its file:line.

A log is a regular file (node/bounded.py: a FIFO is skipped with a note, never waited on), read
in bounded memory (lines.py) and no further than the size it had when opened: a file someone
keeps appending to ends too. A log longer than its share (inputs.py: LOG_HEAD + LOG_TAIL, less
when LOGS_LIMIT is nearly spent) is read from its start and its end only, with a note: a failure's
lines are at the end, and a 1 TiB log (a sparse file costs another user 4 KiB) would take minutes.
The lines past the gap have no number."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import BinaryIO, cast

from ddp_preflight.hangwatch import failures
from ddp_preflight.hangwatch.prefixes import Origin, split_prefix
from ddp_preflight.hangwatch.torchrun_table import SummaryReader
from ddp_preflight.hangwatch.tracebacks import ExceptionInfo, Reader
from ddp_preflight.node.bounded import Skipped, open_regular, size_text
from ddp_preflight.node.protocol import ExitStatus
from ddp_preflight.rules.failures import FAILED_LINE
from ddp_preflight.rules.failures_flight import ANALYZER_IDS
from ddp_preflight.rules.message_parts import (  # noqa: E501
    FAILED_LINE_WORD,
    LAUNCHER_TYPES,
    OOM_KILL_WORDS,
    STOPPED_TYPES,
    USAGE_ERROR_WORD,
    WATCHDOG_WORDS,
)

from .inputs import LOG_HEAD, LOG_TAIL
from .lines import scan
from .messages import MessageReader
from .seen import Gathered, NodeSaid, Quote

REMEMBERED = 5000            # lines remembered per writer to give a quote its number
# torchrun's own line on the first worker of its node that it saw fail (torch.distributed.elastic's
# multiprocessing api: "failed (exitcode: -9) local_rank: 1 (pid: 123) of binary: ..."): a negative
# exitcode is the signal's number.
TORCHRUN_LOGS = re.compile(r"(?:^|/)attempt_\d+/(?P<local>\d+)/(?:stdout|stderr)\.log$")


class _Writer:
    def __init__(self) -> None:
        self.reader = Reader()
        self.numbers: dict[str, int | None] = {}
        self.marker: int | None = None
        self.exception: ExceptionInfo | None = None
        self.quotes: list[Quote] = []


class LogReader:
    def __init__(self, gathered: Gathered, path: str, node: str | None):
        self.gathered, self.path, self.node = gathered, path, node
        self.writers: dict[Origin, _Writer] = {}
        self.table = SummaryReader()
        self.tables: list = []            # this file's torchrun tables
        self.failed: list[tuple[str | None, int, int, ExitStatus, Quote]] = []   # torchrun's "failed (exitcode" lines
        self.messages = MessageReader(gathered.messages, path)

    def idle(self) -> bool:
        return not self.table.reading and all(w.reader.idle for w in self.writers.values())

    def feed(self, number: int | None, line: str) -> None:
        """One line, with its number in the file (None: past the part of a long log not read)."""
        self.messages.feed(number, line)
        self.table.feed(line)
        if self.table.found is not None:
            found, self.table.found = self.table.found, None
            self.tables.append(found)
            self.gathered.tables.append((found.host or self.node, found, Quote(self.path, number, found.quote[0]
                                                                                if found.quote else line)))
        origin, text = split_prefix(line)
        writer = self.writers.get(origin.writer)
        if writer is None:
            writer = self.writers[origin.writer] = _Writer()
        if origin.marker is not None and writer.marker is None:
            writer.marker = origin.marker
        raw = line.rstrip("\r\n")
        if len(writer.numbers) > REMEMBERED:
            writer.numbers.clear()
        writer.numbers[raw] = number
        seen = writer.reader.feed(line)
        if seen is not None:
            writer.exception = seen
            writer.quotes = [Quote(self.path, writer.numbers.get(q), q) for q in seen.quote]
        self._lines(origin, text, number, raw)

    def _lines(self, origin: Origin, text: str, number: int | None, raw: str) -> None:
        """The lines outside a traceback that name a failure."""
        if FAILED_LINE_WORD in text:
            found = FAILED_LINE.search(text)
            if found is not None:     # read into an ExitStatus here, once
                self.failed.append((origin.node or self.node, int(found["local"]), int(found["pid"]),
                                    ExitStatus.from_returncode(int(found["code"])), Quote(self.path, number, raw)))
        if USAGE_ERROR_WORD in text:
            said = failures.usage_error(text)
            if said is not None:
                self.gathered.nodes.append(NodeSaid(origin.node or self.node, said, text, [Quote(self.path, number, raw)]))
                return
        if any(w in text for w in OOM_KILL_WORDS):
            said = failures.oom_kill(text)
            if said is not None:
                self.gathered.nodes.append(NodeSaid(origin.node or self.node, said, text, [Quote(self.path, number, raw)]))
                return
        if any(w in text for w in WATCHDOG_WORDS):
            line = failures.watchdog(text)
            if line is None:
                return
            rank = line.rank if line.rank is not None else (origin.rank if origin.rank is not None else origin.marker)
            seen = self.gathered.rank(origin.node or self.node, rank, origin.local_rank)
            if line.seq is not None:
                seen.watchdog = line
            if line.enqueued is not None:
                seen.enqueued, seen.completed = line.enqueued, line.completed
            if len(seen.watchdog_quotes) < 4:
                seen.watchdog_quotes.append(Quote(self.path, number, raw))

    def close(self) -> None:
        """Each writer's last exception, to the rank it belongs to (or the node's launcher)."""
        for dump in self.messages.dumps.dumps.values():      # Flight Recorder dumps pasted as text: as their files
            seen = self.gathered.rank(self.node, dump.rank)
            if seen.flight is None and any(isinstance(e.get("collective_seq_id"), int) for e in dump.entries):
                seen.flight = {"entries": dump.entries, "path": self.path}
        from_name = TORCHRUN_LOGS.search(self.path.replace("\\", "/"))
        offsets = self._offsets()
        prefixed = any(o.local_rank is not None or o.rank is not None or o.marker is not None for o in self.writers)
        for origin, writer in self.writers.items():
            info = writer.exception
            if info is not None and (info.type.endswith(STOPPED_TYPES) or info.failure in ANALYZER_IDS):
                info = None          # a stop by hand (Ctrl-C) or a scheduler's: a consequence, never the rank's own failure;
                                     # the Flight Recorder analyzer's own assert: the tool's
            node = origin.node or self.node
            launcher = (origin.node is not None and origin.rank is None) or \
                (origin == Origin() and not from_name and (prefixed or _launcher_own(info)))
            if launcher:
                said = failures.said_by(info.type, _words(info)) if info is not None else None
                if said is not None and info is not None:
                    self.gathered.nodes.append(NodeSaid(node, said, f"{info.type}: {info.message}", writer.quotes))
                continue
            local = origin.local_rank if origin.local_rank is not None else \
                (int(from_name["local"]) if from_name else None)
            rank = origin.rank if origin.rank is not None else writer.marker
            if rank is None and local is not None and node in offsets:
                rank = offsets[node] + local
            if info is None and rank is None:
                continue
            seen = self.gathered.rank(node, rank, local)
            if seen.rank is None and seen.writer is None:
                # No rank number: named by where it wrote (never by a made-up number).
                seen.writer = (f"local rank {local} of " if local is not None else "the writer of ") + self.path
            if info is not None:
                seen.exception, seen.source, seen.quotes = info, "output", writer.quotes
                seen.said = failures.said_by(info.type, _words(info))
        for node, local, pid, status, quote in self.failed:
            found = next((s for s in self.gathered.ranks if s.pid == pid and s.node in (node, None)), None)
            if found is None and node in offsets:
                found = self.gathered.rank(node, offsets[node] + local, local)
            if found is None:
                continue          # whose rank it was, nothing here says
            seen = found
            seen.pid = pid if seen.pid is None else seen.pid
            if seen.exit is None:
                seen.exit = status
                seen.exit_quotes.append(quote)

    def _offsets(self) -> dict[str | None, int]:
        """node -> its first global rank (static rendezvous: a node's ranks are consecutive), from a
        writer whose local rank and torch's rank marker are both known, torchrun's table, or a
        launch's plan."""
        out: dict[str | None, int] = {}
        for origin, writer in self.writers.items():
            if origin.local_rank is not None and writer.marker is not None:
                out.setdefault(origin.node or self.node, writer.marker - origin.local_rank)
        for table in self.tables:
            for child in (*table.others, table):
                if child.local_rank is not None and child.rank is not None:
                    out.setdefault(self.node, child.rank - child.local_rank)
        g = self.gathered
        for node, first in g.first_ranks().items():      # a launch's plan: each node's own ranks
            out.setdefault(node, first)
        return out


def _words(info: ExceptionInfo) -> str:
    """An exception's message and, when a chain's earlier exception said more, that one's too (a
    wrapper's ValueError raised from Gloo's timeout)."""
    return info.message + (f"\n{info.cause}" if info.cause else "")


def _launcher_own(info: ExceptionInfo | None) -> bool:
    """An unprefixed exception that torchrun itself raised (its store, its parser), not a rank's, or
    mp.spawn's word on a process it started (its ProcessExitedException)."""
    if info is not None and info.type.endswith(LAUNCHER_TYPES):
        return True
    said = failures.said_by(info.type, info.message) if info is not None else None
    own = (failures.Failure.PORT_IN_USE, failures.Failure.RENDEZVOUS_TIMEOUT, failures.Failure.SCRIPT_OPTIONS)
    return info is not None and said is not None and said.failure in own and info.file is None


def read_log(gathered: Gathered, path: str, stream: BinaryIO | None = None, limit: int | None = None) -> None:
    """`limit`: the bytes of the file that may be read (inputs.py's share; at most LOG_HEAD + LOG_TAIL)."""
    node = None if path == "-" else _node_of(path)
    reader = LogReader(gathered, "<stdin>" if path == "-" else path, node)
    if stream is not None:
        scan(stream, reader.feed, reader.idle)
    elif path == "-":
        scan(sys.stdin.buffer, reader.feed, reader.idle)
    else:
        try:
            fd, st = open_regular(path)
        except Skipped as exc:
            gathered.skipped.append(f"{path}: {exc}")
            return
        except OSError as exc:
            gathered.skipped.append(f"{path}: unreadable: {exc.strerror}")
            return
        with os.fdopen(fd, "rb") as f:
            _scan_file(gathered, path, f, st.st_size, reader, limit)
    reader.close()


def _scan_file(gathered: Gathered, path: str, f: BinaryIO, size: int, reader: LogReader, limit: int | None) -> None:
    """The file, or its first and its last part when it is longer than it may be read (said)."""
    allowed = LOG_HEAD + LOG_TAIL if limit is None else min(limit, LOG_HEAD + LOG_TAIL)
    if size <= allowed:
        scan(cast(BinaryIO, _Upto(f, size)), reader.feed, reader.idle)
        return
    tail = min(LOG_TAIL, allowed // 2)
    head = allowed - tail
    gathered.skipped.append(f"{path}: the middle of a log of {size_text(size)} (read its first {size_text(head)} "
                            f"and its last {size_text(tail)})")
    scan(cast(BinaryIO, _Upto(f, head)), reader.feed, reader.idle)
    f.seek(size - tail - 1)
    at_line_start = f.read(1) == b"\n"
    rest = cast(BinaryIO, _Upto(f, tail) if at_line_start else _FromNextLine(_Upto(f, tail)))
    scan(rest, lambda _number, line: reader.feed(None, line), reader.idle)


class _Upto:
    """A file read no further than `size` bytes."""

    def __init__(self, stream: BinaryIO, size: int):
        self.stream, self.left = stream, size

    def read(self, count: int) -> bytes:
        data = self.stream.read(min(count, self.left)) if self.left > 0 else b""
        self.left -= len(data)
        return data


class _FromNextLine:
    """A stream from its first line break on: the tail of a long log starts inside a line."""

    def __init__(self, stream: _Upto):
        self.stream, self.found = stream, False

    def read(self, count: int) -> bytes:
        while not self.found:
            data = self.stream.read(count)
            if not data:
                return b""
            cut = data.find(b"\n")
            if cut >= 0:
                self.found = True
                if cut + 1 < len(data):
                    return data[cut + 1:]
        return self.stream.read(count)


def _node_of(path: str) -> str:
    """A node log's name is its node's ("worker1.log", as ddp-preflight --launch and the corpus name
    them); a torchrun log folder's file is its folder's."""
    p = Path(path)
    if TORCHRUN_LOGS.search(path.replace("\\", "/")):
        return p.parents[3].name if len(p.parents) > 3 else p.stem
    return p.stem
