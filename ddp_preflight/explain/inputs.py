"""What each PATH holds: a folder is every file under it; a file is told by its name and its first
bytes. Nothing is read whole here.

What is read is bounded (node/bounded.py): a regular file only (a FIFO, a socket or a device is
skipped with a note, never opened to wait on), a symlink inside a folder is not followed (a path
named on the command line is), a JSON document or a pickled dump up to JSON_LIMIT each and
DOCUMENTS_LIMIT in all, a log up to LOG_HEAD + LOG_TAIL (its first and its last part: logs.py)
and LOGS_LIMIT in all, a folder walked without recursion no deeper than MAX_DEPTH and no further
than FILES_LIMIT names; each file not read is said with why ("not read: ..."). So explain of any
folder answers in a time bounded by those caps, whatever another user left in it."""

from __future__ import annotations

import enum
import io
import json
import os
import re
import select
import time
from dataclasses import dataclass
from pathlib import Path

from ddp_preflight.node.bounded import MAX_DEPTH, Skipped, kind, open_regular, read_regular, size_text, walk

SNIFF = 4096                # bytes read to tell a file's kind
JSON_LIMIT = 64 << 20       # a document (error file, dump, bundle; JSON or a pickle) larger than this is not read
DOCUMENTS_LIMIT = 256 << 20  # documents read in all: the ones after are said, not read
LOG_HEAD = 512 << 20        # a longer log is read from its start this far, and LOG_TAIL from its end
LOG_TAIL = 512 << 20        # (a failure's lines are at the end; the middle of a 1 TiB log is not read)
LOGS_LIMIT = 4 << 30        # logs read in all (seconds at the speed of lines.py): the ones after are said, not read
BINARY = "binary"           # why a file that is neither text, JSON nor a pickle is not read
FILES_LIMIT = 100_000       # files and folders taken from one folder
# How a JSON document starts: an object's first key, or an array's first value. A log whose first
# line starts with a bracket ("[worker1 r1] ...", "[default0]:...") does not.
JSON_START = re.compile(rb'\s*(?:\{\s*["}]|\[\s*(?:["{\[\]]|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?\s*[,\]]|true\b|false\b|null\b))')


class InputKind(enum.Enum):
    LOG = "log"                    # text: a rank's, torchrun's, a launch's node log, a Slurm job's output
    ERROR_FILE = "error-file"      # torchelastic's error file (TORCHELASTIC_ERROR_FILE)
    FLIGHT = "flight-recorder"     # a Flight Recorder dump: torch's JSON, or its pickle (NCCL)
    BUNDLE = "incident"            # hangwatch's incident.json
    LAUNCH_RESULT = "launch-result"    # ddp-preflight --launch's result.json
    PLAN = "launch-plan"           # its plan.json
    OTHER = "other"                # read by nothing here (a binary, another JSON)


@dataclass(frozen=True)
class Input:
    path: str                      # as the user named it ("-" for stdin)
    kind: InputKind
    why: str | None = None         # OTHER: why it is not read
    limit: int | None = None       # LOG: the bytes of it that may be read (its share of LOGS_LIMIT)


class InputError(Exception):
    """A PATH that cannot be read at all: one line, the CLI's exit 2."""


def find(paths: list[str]) -> list[Input]:
    found: list[Input] = []
    budget = [DOCUMENTS_LIMIT]
    logs = [LOGS_LIMIT]
    for path in paths:
        if path == "-":
            found.append(Input("-", InputKind.LOG))
            continue
        p = Path(path)
        if p.is_dir():
            notes: list[Input] = []
            files = sorted(_walk(p, notes))
            found += [kind_of(str(f), budget, follow=False, logs=logs) for f in files] + notes
        elif p.is_file():
            named = kind_of(path, budget, logs=logs)
            if named.kind is InputKind.OTHER and named.why == BINARY:
                # Named by the user: a file nothing here reads is a wrong input, not "no failure found".
                raise InputError(f"{path} is a binary file, not a log: give a run's log folder, a log file, an "
                                 "error file, a Flight Recorder dump or an incident bundle")
            found.append(named)
        elif p.exists():
            raise InputError(f"{path} is {kind(p.stat().st_mode)}, neither a file nor a folder: give a run's log "
                             "folder or its files")
        else:
            raise InputError(f"{path} does not exist: give a run's log folder, a log file, an error file, a "
                             "Flight Recorder dump, an incident bundle, or - for stdin")
    return found


def _walk(folder: Path, notes: list[Input]):
    """Every name under the folder that is not a folder (node/bounded.py's walk: no recursion, no
    deeper than MAX_DEPTH), up to FILES_LIMIT names and folders; what was left is said in `notes`."""
    count = 0
    too_deep: list[str] = []
    for root, dirs, files in walk(str(folder), too_deep=too_deep):
        count += len(dirs) + len(files)
        if count > FILES_LIMIT:
            yield from (Path(root) / name for name in files[:max(0, len(files) - (count - FILES_LIMIT))])
            notes.append(Input(str(folder), InputKind.OTHER,
                               f"more than {FILES_LIMIT:,} files and folders: the ones after are not read"))
            break
        yield from (Path(root) / name for name in files)
    if too_deep:
        more = f" (and {len(too_deep) - 1:,} more)" if len(too_deep) > 1 else ""
        notes.append(Input(too_deep[0], InputKind.OTHER, f"a folder deeper than {MAX_DEPTH} levels, not entered{more}"))


def kind_of(path: str, budget: list[int] | None = None, follow: bool = True, logs: list[int] | None = None) -> Input:
    """`budget`: the bytes of documents still to be read in all (spent here); `follow`: whether a
    symlink is read (a path the user named) or not (a name found in a folder); `logs`: the bytes of
    logs still to be read in all (a log's share is spent here)."""
    try:
        fd, st = open_regular(path, follow=follow)
    except Skipped as exc:
        if not follow and str(exc).startswith("a symlink"):
            return Input(path, InputKind.OTHER, "a symlink inside a folder, not followed (name it to read it)")
        return Input(path, InputKind.OTHER, str(exc))
    except OSError as exc:
        return Input(path, InputKind.OTHER, f"unreadable: {exc.strerror}")
    with os.fdopen(fd, "rb") as f:
        head = f.read(SNIFF)
    size = st.st_size
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        # A pickle: torch's NCCL dump.
        too_much = _over(size, budget, "a Flight Recorder dump (a pickle)")
        return Input(path, InputKind.OTHER, too_much) if too_much else Input(path, InputKind.FLIGHT)
    if b"\0" in head:
        return Input(path, InputKind.OTHER, BINARY)
    if JSON_START.match(head):
        too_much = _over(size, budget, "a JSON document")
        return Input(path, InputKind.OTHER, too_much) if too_much else _json_kind(path, follow, logs)
    return _log(path, size, logs)


def _log(path: str, size: int, logs: list[int] | None) -> Input:
    """A log, with the bytes of it that may be read: at most LOG_HEAD + LOG_TAIL, and what is left
    of LOGS_LIMIT (spent here); past that, not read."""
    share = min(size, LOG_HEAD + LOG_TAIL)
    if logs is None:
        return Input(path, InputKind.LOG, limit=share)
    if logs[0] <= 0 and size > 0:
        return Input(path, InputKind.OTHER, f"a log of {size_text(size)}: {size_text(LOGS_LIMIT)} of logs were read "
                                            "already, the most read in all")
    share = min(share, logs[0])
    logs[0] -= share
    return Input(path, InputKind.LOG, limit=share)


def _over(size: int, budget: list[int] | None, what: str) -> str | None:
    """Why a document of `size` bytes is not read (over the limit of one, or of all), or None;
    what it will take is spent from the budget."""
    if size > JSON_LIMIT:
        return f"{what} of {size_text(size)}: over {size_text(JSON_LIMIT)}, the most read of one"
    if budget is not None:
        if size > budget[0]:
            return (f"{what} of {size_text(size)}: {size_text(DOCUMENTS_LIMIT)} of documents were read already, "
                    "the most read in all")
        budget[0] -= size
    return None


def _flight_dump(data: dict) -> bool:
    """torch's Flight Recorder JSON: its version, process groups and their status; "entries" only
    once a collective ran (a rank that ran none dumps `"pg_status": {}` and no entries)."""
    return "pg_status" in data or ("entries" in data and ("version" in data or "pg_config" in data))


def _json_kind(path: str, follow: bool = True, logs: list[int] | None = None) -> Input:
    try:
        raw = read_regular(path, JSON_LIMIT, follow=follow)
        data = json.loads(raw.decode("utf-8", errors="replace"))
    except ValueError:
        return _log(path, len(raw), logs)                 # a log that starts like JSON
    except RecursionError:                                # Python's parser recurses: [[[[... 200,000 deep
        return Input(path, InputKind.OTHER, "a JSON document nested too deep to read")
    except OSError as exc:
        return Input(path, InputKind.OTHER, str(exc) if isinstance(exc, Skipped) else f"unreadable: {exc.strerror}")
    if not isinstance(data, dict):
        return Input(path, InputKind.OTHER, "a JSON document of another kind")
    message = data.get("message")
    if isinstance(message, dict) and ("extraInfo" in message or "message" in message):
        return Input(path, InputKind.ERROR_FILE)
    if _flight_dump(data):
        return Input(path, InputKind.FLIGHT)
    if isinstance(data.get("flight"), dict) and (_flight_dump(data["flight"]) or "entries" in data["flight"]):
        return Input(path, InputKind.FLIGHT)              # the launcher's kept dump: {"rank", "node", "flight"}
    if "snapshot" in data:
        return Input(path, InputKind.BUNDLE)
    if "ranks" in data and "stop_reason" in data:
        return Input(path, InputKind.LAUNCH_RESULT)
    if ("nproc_per_node" in data or "ranks_per_node" in data) and "nodes" in data:
        return Input(path, InputKind.PLAN)
    return Input(path, InputKind.OTHER, "a JSON document of another kind")


# stdin (`explain -`): a pipe or a terminal that may never end. Read as much as one log file is
# (its first part only: a stream has no end to seek to), and for at most STDIN_SECONDS; then it
# stops, and the explanation says how much was read and that the rest was not.
STDIN_BYTES = LOG_HEAD + LOG_TAIL
STDIN_SECONDS = 60.0


class BoundedStdin(io.RawIOBase):
    """A file descriptor read up to `most_bytes` and until `most_seconds` have passed since the
    first read (a select with the time left: a writer that never writes, or trickles, stops it
    too). `stopped` says why it stopped before the end of its input ("size", "time"), else None."""

    def __init__(self, fd: int = 0, most_bytes: int = STDIN_BYTES, most_seconds: float = STDIN_SECONDS):
        super().__init__()
        self.fd, self.most_bytes, self.most_seconds = fd, most_bytes, most_seconds
        self.got = 0
        self.started: float | None = None
        self.stopped: str | None = None
        self.ended = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.stopped or self.ended:
            return 0
        now = time.monotonic()
        self.started = now if self.started is None else self.started
        left = self.started + self.most_seconds - now
        ready = select.select([self.fd], [], [], max(0.0, left))[0] if left > 0 else []
        if not ready:
            self.stopped = "time"
            return 0
        if self.got >= self.most_bytes:
            # At the cap: stopped, unless the input ends right here.
            self.ended = not os.read(self.fd, 1)
            self.stopped = None if self.ended else "size"
            return 0
        data = os.read(self.fd, min(len(buffer), self.most_bytes - self.got))
        if not data:
            self.ended = True
            return 0
        buffer[:len(data)] = data
        self.got += len(data)
        return len(data)

    def note(self) -> str | None:
        """What the explanation says of stdin when it stopped before its end; None otherwise."""
        if self.stopped is None:
            return None
        seconds = time.monotonic() - (self.started or time.monotonic())
        why = (f"it reached {size_text(self.most_bytes)}" if self.stopped == "size"
               else f"it was still open after {self.most_seconds:g} s")
        return (f"-: stopped reading stdin after {size_text(self.got)} in {seconds:.0f} s, as {why} (stdin is read "
                f"up to {size_text(self.most_bytes)} and {self.most_seconds:g} s): the rest was not read; save it to "
                "a file and give its path")
