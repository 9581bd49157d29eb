"""What each PATH holds: a folder is every file under it; a file is told by its name and its first
bytes. Nothing is read whole here."""

from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass
from pathlib import Path

SNIFF = 4096                # bytes read to tell a file's kind
JSON_LIMIT = 64 << 20       # a JSON document (error file, dump, bundle) larger than this is not read
FILES_LIMIT = 100_000       # files taken from one folder


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


class InputError(Exception):
    """A PATH that cannot be read at all: one line, the CLI's exit 2."""


def find(paths: list[str]) -> list[Input]:
    found: list[Input] = []
    for path in paths:
        if path == "-":
            found.append(Input("-", InputKind.LOG))
            continue
        p = Path(path)
        if p.is_dir():
            files = sorted(f for f in _walk(p))
            found += [kind_of(str(f)) for f in files]
        elif p.is_file():
            found.append(kind_of(path))
        elif p.exists():
            raise InputError(f"{path} is neither a file nor a folder")
        else:
            raise InputError(f"{path} does not exist: give a run's log folder, a log file, an error file, a "
                             "Flight Recorder dump, an incident bundle, or - for stdin")
    return found


def _walk(folder: Path):
    count = 0
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            count += 1
            if count > FILES_LIMIT:
                return
            yield Path(root) / name


def kind_of(path: str) -> Input:
    try:
        with open(path, "rb") as f:
            head = f.read(SNIFF)
        size = os.path.getsize(path)
    except OSError as exc:
        return Input(path, InputKind.OTHER, f"unreadable: {exc.strerror}")
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return Input(path, InputKind.FLIGHT)             # a pickle: torch's NCCL dump
    if b"\0" in head:
        return Input(path, InputKind.OTHER, "binary")
    if head.lstrip()[:1] in (b"{", b"["):
        if size > JSON_LIMIT:
            return Input(path, InputKind.OTHER, f"a JSON document over {JSON_LIMIT >> 20} MiB")
        return _json_kind(path)
    return Input(path, InputKind.LOG)


def _json_kind(path: str) -> Input:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            data = json.load(f)
    except ValueError:
        return Input(path, InputKind.LOG)                 # a log that starts with a brace
    except OSError as exc:
        return Input(path, InputKind.OTHER, f"unreadable: {exc.strerror}")
    if not isinstance(data, dict):
        return Input(path, InputKind.OTHER, "a JSON document of another kind")
    message = data.get("message")
    if isinstance(message, dict) and ("extraInfo" in message or "message" in message):
        return Input(path, InputKind.ERROR_FILE)
    if "entries" in data and ("pg_status" in data or "version" in data or "pg_config" in data):
        return Input(path, InputKind.FLIGHT)
    if isinstance(data.get("flight"), dict) and "entries" in data["flight"]:
        return Input(path, InputKind.FLIGHT)              # the launcher's kept dump: {"rank", "node", "flight"}
    if "snapshot" in data:
        return Input(path, InputKind.BUNDLE)
    if "ranks" in data and "stop_reason" in data:
        return Input(path, InputKind.LAUNCH_RESULT)
    if "nproc_per_node" in data and "nodes" in data:
        return Input(path, InputKind.PLAN)
    return Input(path, InputKind.OTHER, "a JSON document of another kind")
