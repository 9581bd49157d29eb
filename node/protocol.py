"""What nodes say to the master: one line each, `MARKER` + JSON, on stdout. Declared once, here;
the master imports this module too. Lines without a marker are the programs' own output (a
rank's lines under launch), passed on as text.

The job scripts that run inside torchrun's ranks import it from the package's zip as well."""

from __future__ import annotations

import json
import sys
import threading
from dataclasses import asdict, dataclass
from typing import Any, Optional

PREFIX = "DDP_PREFLIGHT_"

FACTS = "DDP_PREFLIGHT_FACTS "              # the collectors' result (one line, possibly large)
PROGRESS = "DDP_PREFLIGHT_PROGRESS "        # shard hashing: [done bytes, total, done files, total]
CLOCK = "DDP_PREFLIGHT_CLOCK "              # the node's time.time() as the program starts
JOB = "DDP_PREFLIGHT_JOB "                  # the supervisor's outcome of its job (JobOutcome)
LAUNCH = "DDP_PREFLIGHT_LAUNCH "            # the launch runner: started, ranks, exits, error
READY = "DDP_PREFLIGHT_READY "              # the network probe's listener is up (its ports)
RESULT = "DDP_PREFLIGHT_RESULT "            # the network probe's outcome
COLLECTIVES = "DDP_PREFLIGHT_COLLECTIVES "  # each rank of the collectives job, one line per case
BANDWIDTH = "DDP_PREFLIGHT_BANDWIDTH "      # rank 0 of the bandwidth job
COMPUTE = "DDP_PREFLIGHT_COMPUTE "          # the compute benchmark's figure
AGENT = "DDP_PREFLIGHT_AGENT "              # hangwatch's agent: hello, rank, sample, stacks, exit
FILE = "DDP_PREFLIGHT_FILE "                # a file received (its private path)
PYTHON = "DDP_PREFLIGHT_PYTHON "            # (stderr) what --python is when it cannot run: missing, a folder...

_lock = threading.Lock()


def line(marker: str, data: Any) -> str:
    return marker + json.dumps(data, default=str)


def emit(marker: str, data: Any, stream=None) -> None:
    """One marked line, whole (threads of one program never interleave their lines)."""
    out = stream or sys.stdout
    text = line(marker, data) + "\n"
    with _lock:
        out.write(text)
        out.flush()


def parse(text: str, marker: str) -> Optional[Any]:
    """The JSON of a line with this marker; None for any other line (or a broken one)."""
    if not text.startswith(marker):
        return None
    try:
        return json.loads(text[len(marker):])
    except ValueError:
        return None


def marked(lines, marker: str) -> list:
    """Every value of the lines with this marker, in order."""
    out = []
    for text in lines:
        value = parse(text, marker)
        if value is not None:
            out.append(value)
    return out


@dataclass(frozen=True)
class JobOutcome:
    """How a supervised job ended: its exit code or the signal that ended it, whether its time
    bound or the master (a stop, or its silence) ended it, and how long it ran."""
    exit: Optional[int] = None
    signal: Optional[int] = None
    timed_out: bool = False
    stopped: Optional[str] = None     # "asked": the master's stop; "master-silent": its lease ran out
    seconds: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "JobOutcome":
        return cls(exit=data.get("exit"), signal=data.get("signal"), timed_out=bool(data.get("timed_out")),
                   stopped=data.get("stopped"), seconds=float(data.get("seconds") or 0.0))
