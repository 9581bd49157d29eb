"""torchrun's own summary of a node's failed ranks: its ChildFailedError table ("Failures:" and "Root
Cause (first observed failure)"), read line by line and bounded. It is torchrun's output, never a
rank's exception (tracebacks.py leaves it out). Pure, standard library only."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ddp_preflight.rules.message_parts import TABLE_EXITCODE as EXITCODE_FIELD
from ddp_preflight.rules.message_parts import TABLE_FIELD as FIELD
from ddp_preflight.rules.message_parts import TABLE_LINE_ENTRY as ENTRY
from ddp_preflight.rules.message_parts import TABLE_NOT_AVAILABLE as NOT_AVAILABLE
from ddp_preflight.rules.message_parts import TABLE_RANK as RANK_FIELD
from ddp_preflight.rules.message_parts import TABLE_ROOT_LINE as ROOT
from ddp_preflight.rules.message_parts import TABLE_START, TABLE_TITLE

from .prefixes import strip_prefix
from .tracebacks import LINE_CHARS, MESSAGE_CHARS

OTHER_FAILURES = 64         # entries of torchrun's "Failures:" table kept


@dataclass(frozen=True)
class ChildFailure:
    """One entry of torchrun's ChildFailedError table, its fields as torchrun printed them."""
    rank: int | None           # global rank
    local_rank: int | None
    exitcode: int | None       # negative: the signal's number
    pid: int | None
    signal: str | None         # "SIGTERM", when the exit code is a signal's
    error_file: str | None     # None for "<N/A>" (the rank did not use @record)
    timestamp: str | None      # "2026-11-25_03:05:05": the node's local time, to the second
    host: str | None
    traceback: str | None      # torchrun's word: "Signal 15 (SIGTERM) received by PID 14266", the error file's traceback, a link


@dataclass(frozen=True)
class FirstObservedFailure(ChildFailure):
    """torchrun's "Root Cause (first observed failure)": the rank of its node that failed first, by
    torchrun's clock (the error file's time, else when torchrun saw the exit). Not the run's root
    cause: only the first on that node, a victim may end before its culprit's exit is seen, and a
    rank that left cleanly (exit 0) is in no table."""
    script: str | None = None                   # "/work/main/examples/hang_train.py" of "... FAILED"
    others: tuple[ChildFailure, ...] = ()       # the "Failures:" above it
    quote: tuple[str, ...] = ()                 # the root cause's rank and exitcode lines, as they were




class _Table:
    """torchrun's ChildFailedError table, read line by line; bounded."""

    def __init__(self) -> None:
        self.found: FirstObservedFailure | None = None
        self._reset()

    def _reset(self) -> None:
        self.reading = False
        self.script: str | None = None
        self.section = ""                         # "failures" | "root"
        self.entry: dict[str, str] | None = None
        self.entry_lines: dict[str, str] = {}
        self.key: str | None = None               # the field a continued line belongs to (traceback)
        self.others: list[ChildFailure] = []

    def feed(self, line: str) -> None:
        text = strip_prefix(line[:LINE_CHARS])
        if text.rstrip().endswith(TABLE_START):
            self._reset()                         # a new table
            self.reading = True
            return
        if not self.reading:
            return
        if set(text) == {"="} and self.section == "root":
            self._close()
            self.reading = False
            return
        if set(text) <= {"=", "-"} and text:
            self._close()
            return
        title = TABLE_TITLE.match(text)
        if title and self.section == "" and self.script is None:
            self.script = title["script"]
            return
        if text == "Failures:":
            self.section = "failures"
            return
        if text == ROOT:
            self._close()
            self.section = "root"
            return
        if ENTRY.match(text):
            self._close()
            self.entry, self.entry_lines, self.key = {}, {}, None
            return
        field = FIELD.match(text)
        if field and self.entry is not None:
            self.key = field["key"]
            self.entry[self.key] = field["value"]
            self.entry_lines[self.key] = line.rstrip("\r\n")
            return
        if self.entry is not None and self.key == "traceback" and text.startswith("  "):
            so_far = self.entry["traceback"]
            if len(so_far) < MESSAGE_CHARS:
                self.entry["traceback"] = (so_far + "\n" + text[2:])[:MESSAGE_CHARS]

    def _close(self) -> None:
        if self.entry is None:
            return
        entry, lines = self.entry, self.entry_lines
        self.entry = None
        rank = RANK_FIELD.match(entry.get("rank", ""))
        code = EXITCODE_FIELD.match(entry.get("exitcode", ""))
        error_file = entry.get("error_file", "").strip()
        child = ChildFailure(
            rank=int(rank["rank"]) if rank else None,
            local_rank=int(rank["local"]) if rank and rank["local"] else None,
            exitcode=int(code["code"]) if code else None,
            pid=int(code["pid"]) if code and code["pid"] else None,
            signal=code["signal"] if code else None,
            error_file=error_file if error_file and error_file != NOT_AVAILABLE else None,
            timestamp=entry.get("time", "").strip() or None,
            host=entry.get("host", "").strip() or None,
            traceback=entry.get("traceback", "").strip() or None)
        if self.section == "root":
            quote = tuple(lines[key] for key in ("rank", "exitcode") if key in lines)
            self.found = FirstObservedFailure(**vars(child), script=self.script, others=tuple(self.others), quote=quote)
        elif len(self.others) < OTHER_FAILURES:
            self.others.append(child)


class SummaryReader(_Table):
    """torchrun's ChildFailedError table, line by line (first_observed_failure's reader): `found`
    holds the last table's root cause once read; `reading` while inside a table."""


def first_observed_failure(lines: Iterable[str]) -> FirstObservedFailure | None:
    """torchrun's summary of a node's failed ranks (its ChildFailedError: "Failures:" and "Root
    Cause (first observed failure)"), the last one in these lines; None when there is none. It is
    torchrun's own output, never a rank's exception."""
    table = _Table()
    found = None
    for line in lines:
        table.feed(line)
        if table.found is not None:
            found, table.found = table.found, None
    return found
