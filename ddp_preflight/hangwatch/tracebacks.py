"""What a rank's output says about how it ended: the exception it raised (or the C++ abort, or the
watchdog's error) read from its lines or its own record, on the master (hangwatch live, `ddp-preflight
explain` after the fact).

Pure: no I/O, standard library only (and ddp_preflight.hangwatch.model's Word). The Gloo, torchrun and C++ abort
messages were seen in real runs (tests/unit/artifacts/logs/, each log with the command that made
it), NCCL's watchdog and error lines on a real H100.

A rank ends by its own failure or as a victim. Its own: an uncaught exception, named by its type,
its message and the innermost line of the training's own code it went through. A victim: it lost a
peer or the link, and says so: lost_peer.py is the catalogue of those messages.

What is read, and how:
- A Python traceback, "Traceback (most recent call last):" to its exception line ("Type:
  message", more lines when the message spans lines). After init_process_group torch prints an
  uncaught exception with "[rankN]: " before every line (its sys.excepthook): those lines are
  one traceback, other lines among them (the rank's stdout through the same pipe) are not. A
  message goes on over the lines that carry the same marker; without the marker it is one line
  (the rank's buffered stdout, flushed at exit, follows a bare traceback).
- A C++ abort: "terminate called after throwing an instance of 'gloo::EnforceNotMet'" and its
  "  what():  ..." line (the C++ stack c10 errors add after it is not kept), or "terminate called
  without an active exception" (a thread still running when the process exits: a rank that
  leaves with its process group alive).
- NCCL's watchdog line "[E... ProcessGroupNCCL.cpp:NNN] [Rank 0] Watchdog caught collective
  operation timeout: WorkNCCL(...) ran for 60022 milliseconds before timing out.": the exception
  the watchdog sets on the collective (c10::DistBackendError), logged; the rank may still hang
  after it (recorded on an H100) or abort.
- torchrun's own lines are not a rank's: its ChildFailedError (the summary table, read by
  torchrun_table.py) and its SignalException when it is stopped are left out, and so is
  a traceback after "Exception ignored in: ..." (Python's unraisable hook: a __del__ failing at
  exit ends nothing). "Original Traceback (most recent call last):" is a DataLoader worker's, in
  the message of the exception the main process raises.

Chained exceptions ("The above exception was the direct cause of the following exception:",
"During handling of the above exception, another exception occurred:") are named by the last one
raised (the one that ended the rank), and `lost_peer` is true when ANY exception of the chain says
a peer or the link was lost (`cause` says which, when not the last). Why any, and not only the
last: a wrapper that re-raises a Gloo error as its own ValueError (`raise ... from exc`) is a
victim, and so is a rank whose handler of a lost peer then fails (saving a checkpoint, another
collective). The cost: a rank whose own error came first and whose handler then lost a peer reads
as a victim; but an implicit context is as often control flow (StopIteration at an epoch's end,
a KeyError fallback) as an error, so the first exception of a chain cannot be taken as the cause.

After a traceback with torch's "[rankN]:" marker (uncaught for certain: the process is ending), a
C++ abort or a watchdog line is that process's teardown (sys.exit and raise in a rank with a live
Gloo group may end in "terminate called without an active exception"): the exception stays the
one named. After a traceback without the marker (it may have been caught and logged) only that
untyped abort is taken as teardown; a typed abort or a watchdog line is named. A later traceback
is always named instead (the last one).

Lines may carry prefixes (prefixes.py: the launcher's, torchrun --tee's, torch's marker)."""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from ddp_preflight.rules import failures

from .lost_peer import lost_peer, peer_in
from .model import Word
from .prefixes import Origin, split_prefix

MESSAGE_LINES = 40          # lines of one message kept (NCCL's span 4)
MESSAGE_CHARS = 4000        # characters of one message kept (node/rank_bootstrap.py records 2000)
LINE_CHARS = 65536          # characters of one line read (transport/lines.py cuts a rank's line there too)
TRACEBACK_LINES = 100_000   # lines a traceback may run before it is taken as cut off (none are kept)


class ExceptionKind(Word):
    """How the rank said it (a word: ExceptionInfo stays plain data for JSON)."""
    RAISED = "raised"        # a Python exception (a traceback, or the rank's own record)
    ABORTED = "aborted"      # a C++ abort: "terminate called ..."
    LOGGED = "logged"        # an error the rank logged and set on its collective (NCCL's watchdog)


@dataclass(frozen=True)
class ExceptionInfo:
    type: str                  # "RuntimeError", "torch.OutOfMemoryError"; a C++ abort's C++ type ("gloo::IoException")
    message: str               # after "Type: "; a message over several lines joined with "\n" (bounded)
    file: str | None           # the innermost frame of the training's own code, as its short name ("train.py")
    line: int | None
    function: str | None
    lost_peer: bool            # a message a rank gives when it loses a peer or the link (lost_peer()), in any of the chain
    peer: str | None           # the peer's address when the message names it ("10.213.5.2:24077")
    quote: tuple[str, ...]     # the lines it rests on, as they were: the exception line, the frame line it
                               # names, and the line of the chain's lost peer when that is another exception's
                               # (an abort: its "terminate called ..." and "what():" lines)
    path: str | None = None    # that frame's file as the rank's Python named it ("/home/me/nanochat/train.py")
    cause: str | None = None   # the earlier exception of the chain that lost the peer ("RuntimeError: [...] Connection
                               # closed by peer [10.213.5.2]:24077"), when the last one does not say it itself
    kind: ExceptionKind = ExceptionKind.RAISED
    failure: str | None = None  # its message's id in the one catalogue (rules/failures.py: "cuda-oom"); None: not there


# Frames not of the training's own code: installed packages, the standard library, torch in a
# source checkout, torch.compile's generated files, Python's own (<frozen runpy>, <string>), and
# ddp-preflight's bootstrap in front of the script (its frames show before Python 3.11).
NOT_OWN = re.compile(
    r"/(?:site|dist)-packages/|/lib/python\d(?:\.\d+)?t?/|^<|/torchinductor_|(?:^|/)rank_bootstrap\.py$"
    r"|/torch/(?:distributed|nn|autograd|utils|cuda|optim|multiprocessing|fx|amp|_[a-z_]+)/|/torch/_tensor\.py$")
FRAME = re.compile(r'^\s+File "(?P<path>[^"]+)", line (?P<line>\d+)(?:, in (?P<function>.+?))?\s*$')


def own_code(path: str) -> bool:
    return not NOT_OWN.search(path)


def short_name(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


# -- reading a rank's output -------------------------------------------------------------------------

TRACEBACK = "Traceback (most recent call last):"
IGNORED = "Exception ignored"            # Python's unraisable hook ("Exception ignored in: <function ...>")
CHAINED = ("The above exception was the direct cause of the following exception:",
           "During handling of the above exception, another exception occurred:")
EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?:: ?(?P<message>.*))?$")
# torchrun's own exceptions: its summary of the ranks' failures, and its being stopped.
LAUNCHERS_OWN = ("ChildFailedError", "SignalException")
THROWING = re.compile(r"terminate called after throwing an instance of '(?P<type>[^']+)'")
WHAT = re.compile(r"^\s*what\(\):\s*(?P<message>.*)$")
ABORTED = "terminate called"
NO_EXCEPTION = "std::terminate"      # the type of an abort without an exception
# A log line of c10 (glog's form, "[W1125 03:04:58.715994756 socket.cpp:207] ...") or torchrun's
# logging ("W1125 03:05:05.715000 14257 .../api.py:1028] ...").
LOG_LINE = re.compile(r"^\[?[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ ")
WATCHDOG = failures.WATCHDOG_CAUGHT      # NCCL's watchdog line, as the one catalogue words it
WATCHDOG_TYPE = "c10::DistBackendError"     # what the watchdog sets on the collective, with that message
# A line without one of these starts nothing (the header, an abort, the watchdog's line).
TRACEBACK_WORD, WATCHDOG_WORDS = "Traceback", failures.WATCHDOG_CAUGHT_WORD


def header(text: str) -> bool:
    """A traceback's first line; a progress bar may be before it on the line. Not one inside a
    message ("Original Traceback ..." of a DataLoader worker's error) or an exception group's."""
    if not text.endswith(TRACEBACK):
        return False
    before = text[:-len(TRACEBACK)]
    return not (before.endswith(" ") and before[-2:-1].isalnum())


class _In(enum.Enum):
    NOTHING = "nothing"
    TRACEBACK = "traceback"      # between "Traceback ..." and its exception line
    MESSAGE = "message"          # after an exception line: its message may go on, a chain may follow
    WHAT = "what"                # after "terminate called after throwing ...": its what() line


@dataclass
class _Chain:
    """What the earlier exceptions of a chain said of a lost peer."""
    lost_peer: bool = False
    peer: str | None = None
    cause: str | None = None
    cause_line: str | None = None


class Reader:
    """One rank's output, line by line (prefixed or bare): `feed()` returns an exception as soon
    as its exception line (or abort) is seen, since a dying process may print nothing after it, and
    again, fuller, for each line its message goes on over. It keeps the traceback being read and
    nothing else: its exception's message (bounded) and its innermost own frame, never its lines."""

    def __init__(self) -> None:
        self._in = _In.NOTHING
        self._marker: int | None = None       # torch's marker on the traceback being read
        self._count = 0                       # lines since its header
        self._own: tuple[str, int, str | None, str] | None = None     # path, line, function, the frame line
        self._chain = _Chain()                # what the chain's earlier exceptions said
        self._chain_open = False              # a chain's "The above exception ..." was seen
        self._base: ExceptionInfo | None = None       # the exception being read, before its message is judged
        self._last: ExceptionInfo | None = None       # ... and as last returned
        self._lines: list[str] = []           # its message's lines
        self._closed = False                  # its message ended (a blank line)
        self._raised = False                  # a Python exception was read: "terminate called without an
                                              # active exception" after it is its process's teardown
        self._ended = False                   # ... an uncaught one for certain (torch's marker): any abort or
                                              # watchdog line after it is
        self._ignore_next = False             # "Exception ignored in ...": the next traceback ends nothing
        self._ignoring = False                # ... and it is the one being read

    @property
    def idle(self) -> bool:
        """Between tracebacks: a line without a traceback's, an abort's or the watchdog's words
        changes nothing (explain skips such lines unread)."""
        return self._in is _In.NOTHING and not self._chain_open

    def feed(self, line: str) -> ExceptionInfo | None:
        line = line[:LINE_CHARS]
        if (self._in is _In.NOTHING and not self._chain_open and TRACEBACK_WORD not in line and ABORTED not in line
                and WATCHDOG_WORDS not in line and IGNORED not in line):
            return None                       # the ordinary line, most of a log: read no further
        origin, text = split_prefix(line)
        raw = line.rstrip("\r\n")
        if text.startswith(IGNORED):
            self._ignore_next = True          # Python's unraisable hook: a traceback that ended nothing
            return None
        if header(text):
            self._start(origin, chained=self._chain_open and origin.marker == self._marker)
            return None
        if text.startswith(ABORTED):
            return self._abort(text, raw)
        if LOG_LINE.match(text):
            if self._in is _In.MESSAGE and origin.marker == self._marker:
                self._in = _In.NOTHING        # a log line ends a message
            watchdog = WATCHDOG.search(text)
            if watchdog and self._in is not _In.TRACEBACK:
                return self._logged(watchdog.group(0), raw)
            return None
        if self._in is _In.TRACEBACK:
            return self._traceback(origin, text, raw)
        if self._in is _In.MESSAGE:
            return self._message(origin, text, raw)
        if self._in is _In.WHAT:
            return self._what(text, raw)
        if self._chain_open and text.strip() and origin.marker == self._marker:
            self._chain_open = False          # something else came before the chain's next traceback
        return None

    # -- a Python traceback ---------------------------------------------------------------------

    def _start(self, origin: Origin, chained: bool) -> None:
        if not chained:
            self._chain = _Chain()
        self._in, self._marker, self._count, self._own = _In.TRACEBACK, origin.marker, 0, None
        self._ignoring, self._ignore_next = self._ignore_next, False
        if not self._ignoring:
            self._chain_open = self._raised = self._ended = False

    def _traceback(self, origin: Origin, text: str, raw: str) -> ExceptionInfo | None:
        self._count += 1
        if self._count > TRACEBACK_LINES:
            self._in = _In.NOTHING            # never ended: cut off
            return None
        if not text.strip() or origin.marker != self._marker:
            return None                       # another writer's line among the traceback's (its stdout)
        frame = FRAME.match(text)
        if frame:
            if own_code(frame["path"]):
                self._own = (frame["path"], int(frame["line"]), frame["function"], raw)
            return None
        if text[0].isspace():
            return None                       # a source line, its carets, "[Previous line repeated ...]"
        exception = EXCEPTION_LINE.match(text)
        if exception is None:
            return None
        if exception["type"].rsplit(".", 1)[-1] in LAUNCHERS_OWN or self._ignoring:
            self._in, self._chain, self._ignoring = _In.NOTHING, _Chain(), False
            return None
        path, line, function, frame_line = self._own if self._own else (None, None, None, None)
        message = exception["message"] or ""
        self._base = ExceptionInfo(
            type=exception["type"], message="", file=short_name(path) if path else None, line=line,
            function=function, lost_peer=False, peer=None, quote=(raw,) + ((frame_line,) if frame_line else ()),
            path=path)
        self._lines, self._closed, self._in = [message], False, _In.MESSAGE
        self._raised, self._ended = True, self._marker is not None
        return self._judged()

    def _message(self, origin: Origin, text: str, raw: str) -> ExceptionInfo | None:
        if origin.marker != self._marker:
            return None                       # another writer's line (the rank's stdout)
        if not text.strip():
            self._closed = True
            return None
        if text in CHAINED:
            self._in, self._chain_open = _In.NOTHING, True
            self._chain = self._chain_with(self._last)
            return None
        if self._marker is None or self._closed or len(self._lines) >= MESSAGE_LINES:
            self._in = _In.NOTHING            # bare: the message is its first line
            return None
        self._lines.append(text)
        return self._judged()

    def _judged(self) -> ExceptionInfo:
        """The exception being read with its message so far, judged with its chain."""
        assert self._base is not None
        base = self._base
        message = "\n".join(self._lines)[:MESSAGE_CHARS]
        chain = self._chain
        failure = failures.id_of(f"{base.type}: {message}")
        if lost_peer(base.type, message):
            found = replace(base, message=message, lost_peer=True, peer=peer_in(message), failure=failure)
        elif chain.lost_peer:
            found = replace(base, message=message, lost_peer=True, peer=chain.peer, cause=chain.cause,
                            quote=base.quote + ((chain.cause_line,) if chain.cause_line else ()), failure=failure)
        else:
            found = replace(base, message=message, failure=failure)
        self._last = found
        return found

    def _chain_with(self, info: ExceptionInfo | None) -> _Chain:
        """The chain so far, with `info` (now an earlier exception of it) added: the first of the
        chain that lost the peer is the cause."""
        if info is None or self._chain.lost_peer or not info.lost_peer:
            return self._chain
        first = info.message.splitlines()[0] if info.message else ""
        return _Chain(True, info.peer, f"{info.type}: {first}" if first else info.type, info.quote[0])

    # -- C++ aborts and logged errors --------------------------------------------------------------

    def _abort(self, text: str, raw: str) -> ExceptionInfo | None:
        self._in, self._chain, self._chain_open = _In.NOTHING, _Chain(), False
        throwing = THROWING.search(text)
        if self._ended or (self._raised and throwing is None):
            return None                       # the teardown of a process an exception ended
        if throwing:
            self._base = ExceptionInfo(throwing["type"], "", None, None, None, False, None, (raw,),
                                       kind=ExceptionKind.ABORTED)
            self._in, self._last = _In.WHAT, self._base
            return self._base
        return ExceptionInfo(NO_EXCEPTION, text, None, None, None, False, None, (raw,), kind=ExceptionKind.ABORTED)

    def _what(self, text: str, raw: str) -> ExceptionInfo | None:
        if not text.strip():
            return None
        self._in = _In.NOTHING
        what = WHAT.match(text)
        if what is None or self._base is None:
            return None                       # its what() never came: the abort as first said
        message = what["message"][:MESSAGE_CHARS]
        lost = lost_peer(self._base.type, message)
        return replace(self._base, message=message, lost_peer=lost, peer=peer_in(message) if lost else None,
                       quote=self._base.quote + (raw,), failure=failures.id_of(f"{self._base.type}: {message}"))

    def _logged(self, message: str, raw: str) -> ExceptionInfo | None:
        self._chain, self._chain_open = _Chain(), False
        if self._ended:
            return None
        return ExceptionInfo(WATCHDOG_TYPE, message[:MESSAGE_CHARS], None, None, None, True, None, (raw,),
                             kind=ExceptionKind.LOGGED)


def exception_in(lines: Iterable[str]) -> ExceptionInfo | None:
    """The last exception (or C++ abort, or watchdog error) in one rank's lines, as the Reader
    fed them line by line last returned it."""
    reader = Reader()
    found = None
    for line in lines:
        seen = reader.feed(line)
        if seen is not None:
            found = seen
    return found


def exceptions_by_writer(lines: Iterable[str]) -> dict[Origin, ExceptionInfo]:
    """The last exception of each writer in a log that holds several (a node's log: its ranks,
    by their prefix, and the node's own lines under Origin())."""
    readers: dict[Origin, Reader] = {}
    found: dict[Origin, ExceptionInfo] = {}
    for line in lines:
        writer = split_prefix(line)[0].writer
        seen = readers.setdefault(writer, Reader()).feed(line)
        if seen is not None:
            found[writer] = seen
    return found


# -- the rank's own record -----------------------------------------------------------------------

def from_record(record: dict) -> ExceptionInfo | None:
    """The exception of a PID.end record (node/rank_bootstrap.py's record_ending) whose "how" is
    "raised": its type (the class's name, unqualified), message, and innermost frame of the
    training's own code. The quote is written as Python prints those lines. A record that also
    carries "causes" ([{"type", "message"}], the chain before it, first to last) is judged with
    its chain as a traceback is."""
    if not isinstance(record, dict) or record.get("how") != "raised" or not record.get("type"):
        return None
    type_, message = str(record["type"]), str(record.get("message") or "")[:MESSAGE_CHARS]
    own = None
    frames = record.get("frames")
    for frame in frames if isinstance(frames, list) else []:
        if isinstance(frame, dict) and isinstance(frame.get("file"), str) and own_code(frame["file"]):
            own = frame
    path = own["file"] if own else None
    line = own.get("line") if own and isinstance(own.get("line"), int) else None
    function = str(own["function"]) if own and own.get("function") is not None else None
    first = message.splitlines()[0] if message else ""
    quote: tuple[str, ...] = (f"{type_}: {first}" if message else type_,)
    if own:
        quote += (f'  File "{path}", line {line}, in {function}',)
    info = ExceptionInfo(type_, message, short_name(path) if path else None, line, function, False, None, quote,
                         path=path, failure=failures.id_of(f"{type_}: {message}"))
    if lost_peer(type_, message):
        return replace(info, lost_peer=True, peer=peer_in(message))
    causes = record.get("causes")
    for cause in causes if isinstance(causes, list) else []:
        if isinstance(cause, dict) and lost_peer(str(cause.get("type")), str(cause.get("message") or "")):
            said = str(cause.get("message") or "")
            line_of = f"{cause.get('type')}: {said.splitlines()[0] if said else ''}"
            return replace(info, lost_peer=True, peer=peer_in(said), cause=line_of, quote=quote + (line_of,))
    return info
