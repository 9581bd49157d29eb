"""Every line of a log read for what the catalogue knows (rules/failures.py), whatever launchers,
loggers and the paste put around it (hangwatch/prefixes.py's normalize): each catalogued message
with the rank, host and time its prefixes say, and how the launchers say each rank ended
(torchrun's "failed (exitcode: N)" line, its ChildFailedError table read field by field so a
flattened or cut table still counts, DeepSpeed's launcher). No gate on what surrounds a line: a
paste that starts mid-traceback, a table alone and one-line errors are read alike. Plain data for
finding.py."""

from __future__ import annotations

import enum
import re
import signal
from dataclasses import dataclass, field, replace

from ddp_preflight.hangwatch.prefixes import Line, normalize
from ddp_preflight.rules import failures
from ddp_preflight.rules import message_parts as parts

from .flight_dump import DumpReader
from .flight_text import Analyzed, AnalyzerReader
from .quote import Quote
from .stacks import Dumped, StackReader

HITS = 256           # lines kept per catalogued message (a log that repeats one warning a million times
                     # keeps its first ones, and every other message still has room)
EXITS = 512          # launcher exits and raised exceptions kept
KEPT_CHARS = 2000    # of each line kept (a line may be 64 KiB: lines.py)


@dataclass(frozen=True)
class Hit:
    """A catalogued message in a line, with what its prefixes said of who wrote it."""
    found: failures.Found
    line: Line
    quote: Quote

    @property
    def message(self) -> failures.Message:
        return self.found.message


@dataclass
class LauncherExit:
    """How a launcher said one rank ended: its exit code (negative: a signal) and who it was."""
    source: str                       # "table" | "failed-line" | "deepspeed" | "spawn" | "launch"
    rank: int | None = None           # the global rank (torchrun's table)
    local_rank: int | None = None
    code: int | None = None
    pid: int | None = None
    signal: str | None = None         # "SIGKILL", as the table names it
    time: str | None = None           # the table's time, to the second
    host: str | None = None
    root: bool = False                # torchrun's "Root Cause (first observed failure)"
    listed: bool = False              # under the table's "Failures:": torchrun puts its first failure under
                                      # "Root Cause", so a rank listed there is never the one that failed first
    quotes: list[Quote] = field(default_factory=list)


@dataclass(frozen=True)
class Raised:
    """A rank's uncaught exception that no catalogued message is in: a traceback's last line."""
    rank: int | None
    type: str
    quote: Quote
    local_rank: int | None = None      # the local index its launcher named it by (mp.spawn's), where no prefix did


class Shown(str, enum.Enum):
    """What a log shows of how its run was set up, that a fix must fit (a closed set)."""
    NCCL_DEBUG_INFO = "nccl-debug-info"     # NCCL's INFO lines: NCCL_DEBUG=INFO was already on
    NCCL = "nccl"                           # the NCCL backend (its words, ProcessGroupNCCL)
    GLOO = "gloo"                           # the Gloo backend
    DEEPSPEED = "deepspeed"                 # DeepSpeed's launcher (its runner's and launch.py's lines)
    TEE = "tee"                             # torchrun's --tee: each rank's own lines, "[default0]:" before them
    SPAWN = "spawn"                         # torch.multiprocessing.spawn: its processes print to this one log
    ACCELERATE = "accelerate"               # accelerate launch (torchrun underneath, its own options)
    SLURM = "slurm"                         # a Slurm job (slurmstepd's and srun's own lines): sacct has its record


SHOWN_BY = ((Shown.NCCL_DEBUG_INFO, ("NCCL INFO",)), (Shown.NCCL, ("NCCL",)), (Shown.GLOO, ("Gloo", "gloo")),
            (Shown.DEEPSPEED, ("sigkill_handler", "deepspeed.launcher", "deepspeed/launcher")), (Shown.TEE, ("[default",)),
            (Shown.SPAWN, ("multiprocessing/spawn.py", "ProcessRaisedException", "ProcessExitedException")),
            (Shown.ACCELERATE, ("accelerate/commands/", "bin/accelerate", "accelerate-launch")),
            (Shown.SLURM, ("slurmstepd", "srun: ")))


@dataclass
class Messages:
    """What one or more files' lines said, in the order they said it."""
    hits: list[Hit] = field(default_factory=list)
    exits: list[LauncherExit] = field(default_factory=list)
    raised: list[Raised] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)     # lines seen per message id
    worlds: set[int] = field(default_factory=set)            # the world sizes lines stated (parts.WORLD_SIZE)
    shown: set[Shown] = field(default_factory=set)           # what the logs show of the run's set-up
    stacks: list[Dumped] = field(default_factory=list)       # py-spy dumps pasted as text (stacks.py)
    analyzed: list[Analyzed] = field(default_factory=list)   # torch's Flight Recorder analyzer's reports (flight_text.py)
    child_failed: list[Quote] = field(default_factory=list)  # torchrun's ChildFailedError: a rank failed, whoever


# A traceback's last line: the exception's type (a launcher's own and a stop by hand are not a rank's failure)
RAISED = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception))(?::\s|$)")
NOT_RAISED = parts.LAUNCHER_TYPES + parts.STOPPED_TYPES
# A line of how a launcher says a rank ended (failures.FAILED_LINE, DEEPSPEED_EXIT, TABLE_*)
EXIT_HINT = parts.EXIT_HINT


class MessageReader:
    """One file's lines, fed in order."""

    def __init__(self, messages: Messages, path: str):
        self.messages, self.path = messages, path
        self.entry: LauncherExit | None = None     # the table entry being read
        self.root_next = False
        self.listing = False                       # inside the table's "Failures:" section
        self.tracing: set[tuple] = set()           # the writers (rank, local rank, host) inside a traceback
        self.spawned: int | None = None            # mp.spawn named the process whose exception comes next
        self.in_launch = False                     # the traceback being read is torch.distributed.launch's own
        self.stack = StackReader(messages.stacks)
        self.analyzer = AnalyzerReader(messages.analyzed)
        self.dumps = DumpReader()                  # this file's Flight Recorder dumps pasted as text (flight_dump.py)

    def feed(self, number: int | None, raw: str) -> None:
        # what a line may be, told by one search each (prefixes do not hide a message's words): only
        # such a line is read further (a log's step lines are most of it)
        catalogued = failures.ANY_WORD.search(raw) is not None
        exits = self.entry is not None or self.root_next or EXIT_HINT.search(raw) is not None
        tracing = bool(self.tracing) or self.spawned is not None or "Traceback" in raw or 'File "' in raw
        if any(w in raw for w in parts.WORLD_SIZE_WORDS):
            self._world(raw)
        if len(self.messages.shown) < len(Shown):
            for shown, words in SHOWN_BY:
                if shown not in self.messages.shown and any(w in raw for w in words):
                    self.messages.shown.add(shown)
        if self.stack.thread is not None or StackReader.may_be(raw):
            self.stack.feed(normalize(raw), Quote(self.path, number, raw.rstrip("\r\n")[:KEPT_CHARS]))
        if self.analyzer.block is not None or AnalyzerReader.may_be(raw):
            self.analyzer.feed(normalize(raw), Quote(self.path, number, raw.rstrip("\r\n")[:KEPT_CHARS]))
        if self.dumps.wants(raw):
            self.dumps.feed(normalize(raw), Quote(self.path, number, raw.rstrip("\r\n")[:KEPT_CHARS]))
        if not (catalogued or exits or tracing):
            return
        line = normalize(raw)
        text = line.text
        if not text.strip():
            return
        quote = Quote(self.path, number, raw.rstrip("\r\n")[:KEPT_CHARS])
        found = failures.find(text) if catalogued else []
        counts = self.messages.counts
        for one in found:
            counts[one.message.id] = counts.get(one.message.id, 0) + 1
            if counts[one.message.id] <= HITS:
                self.messages.hits.append(Hit(one, replace(line, text=text[:KEPT_CHARS]), quote))
        if exits:
            self._exits(line, quote)
        if tracing:
            self._traceback(line, quote, bool(found))

    def _world(self, raw: str) -> None:
        """A world size a line states (the store barrier's world_size too: the world asked for)."""
        for found in parts.WORLD_SIZE.finditer(raw):
            size = int(found["world"] or found["nranks"])
            if 0 < size < 1 << 20 and len(self.messages.worlds) < 16:
                self.messages.worlds.add(size)

    def _traceback(self, line: Line, quote: Quote, catalogued: bool) -> None:
        writer = (line.rank, line.local_rank, line.host)
        if line.text.startswith("Traceback (most recent call last)"):
            self.in_launch = False
        if line.text.startswith(("Traceback (most recent call last)", '  File "')):
            self.tracing.add(writer)     # a traceback, or a paste that starts inside one
            self.in_launch = self.in_launch or parts.LAUNCH_FRAME in line.text
            return
        spawned = self.spawned       # mp.spawn's header: the exception after it is that process's, frames or none
        if (writer not in self.tracing and spawned is None) or line.text[:1].isspace():
            return
        self.tracing.discard(writer)          # a traceback ends at its first line that is not a frame's
        raised = RAISED.match(line.text)
        if raised is None:
            return
        kind = raised["type"]
        if not kind.endswith(NOT_RAISED):
            self.spawned = None
        if not catalogued and not kind.endswith(NOT_RAISED) and len(self.messages.raised) < EXITS:
            self.messages.raised.append(Raised(line.rank, kind, quote, spawned if line.rank is None else None))

    def _exits(self, line: Line, quote: Quote) -> None:
        text = line.text
        if failures.TABLE_ROOT in text:
            self.root_next, self.entry, self.listing = True, None, False
        if text.strip().startswith(parts.TABLE_FAILURES):
            self.listing, self.entry = True, None
        if parts.TABLE_START in text and len(self.messages.child_failed) < EXITS:
            self.messages.child_failed.append(quote)
        if failures.TABLE_ENTRY.match(text.strip()):
            self.entry = None          # the next fields are the next entry's
        if parts.FAILED_LINE_WORD in text:
            found = failures.FAILED_LINE.search(text)
            if found:
                self._add(LauncherExit("failed-line", local_rank=int(found["local"]), code=int(found["code"]),
                                       pid=int(found["pid"]), host=line.host, time=line.time, quotes=[quote]))
        if parts.DEEPSPEED_EXIT_WORD in text:
            found = failures.DEEPSPEED_EXIT.search(text)
            if found:
                # DeepSpeed's launcher prints the command it spawned last, whichever process failed: its
                # --local_rank is the failed one's only where it stopped one process ("Killing subprocess")
                one = self.messages.counts.get("launcher-killing", 0) == 1
                self._add(LauncherExit("deepspeed", local_rank=int(found["local"]) if found["local"] and one else None,
                                       code=int(found["code"]), host=line.host, time=line.time, quotes=[quote]))
        if parts.SPAWN_EXIT_WORD in text:
            found = parts.SPAWN_EXIT.search(text)
            raised = parts.SPAWN_RAISED.search(text)
            if raised:              # it raised: a Python exception, exit code 1
                self.spawned = int(raised["index"])
                self._add(LauncherExit("spawn", local_rank=self.spawned, code=1, host=line.host, time=line.time,
                                       quotes=[quote]))
            if found:
                code = -int(getattr(signal, found["signal"], 0)) if found["signal"] else \
                    int(found["code"]) if found["code"] else None
                self._add(LauncherExit("spawn", local_rank=int(found["index"]), code=code or None,
                                       signal=found["signal"], host=line.host, time=line.time, quotes=[quote]))
        if any(w in text for w in parts.LAUNCH_EXIT_WORDS):
            found = parts.LAUNCH_EXIT.search(text) or (parts.LAUNCH_EXIT_ANY.search(text) if self.in_launch else None)
            if found:
                code = -int(getattr(signal, found["signal"], 0)) if found["signal"] else int(found["code"])
                local = found.groupdict().get("local")
                self._add(LauncherExit("launch", local_rank=int(local) if local else None, code=code or None,
                                       signal=found["signal"], host=line.host, time=line.time, quotes=[quote]))
        if any(w in text for w in parts.TABLE_FIELDS_WORDS):
            for found in failures.TABLE_FIELDS.finditer(text):
                self._field(found.groupdict(), quote)

    def _field(self, said: dict, quote: Quote) -> None:
        entry = self.entry
        if said["rank"] is not None:
            if entry is None or entry.rank is not None:
                entry = self._new()
            entry.rank, entry.local_rank = int(said["rank"]), int(said["local"])
            entry.quotes.append(quote)
        elif said["code"] is not None:
            if entry is None or entry.code is not None:
                entry = self._new()
            entry.code, entry.pid = int(said["code"]), int(said["pid"])
            if quote not in entry.quotes:
                entry.quotes.append(quote)
        elif said["signal"] is not None:
            if entry is None or entry.signal is not None:
                entry = self._new()
            entry.signal = said["signal"]
            entry.code = entry.code if entry.code is not None else -int(said["signum"])
        elif said["time"] is not None:
            if entry is None or entry.time is not None or entry.rank is not None:
                entry = self._new()
            entry.time = said["time"].replace("_", " ")
        elif said["host"] is not None and entry is not None:
            entry.host = said["host"]

    def _new(self) -> LauncherExit:
        self.entry = LauncherExit("table", root=self.root_next, listed=self.listing and not self.root_next)
        self.root_next = False
        self._add(self.entry)
        return self.entry

    def _add(self, exit: LauncherExit) -> None:
        if len(self.messages.exits) < EXITS:
            self.messages.exits.append(exit)
