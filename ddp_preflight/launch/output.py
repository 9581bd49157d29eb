"""Every node's output, as lines that say which node and which rank wrote them, and the run's
log folder on the master: one log file per node, the plan and the result, private to the user,
each written relative to the folder's descriptor (node/private.py), never through a link.

torchrun's `--tee 3` prefixes each rank's lines with its role and local rank ("[default0]:");
the global rank is the node's first rank + local_rank, as torchrun numbers them. Lines without
a prefix are torchrun's own (or the node's), and belong to the node."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ddp_preflight.node.private import Folder, folder
from ddp_preflight.node.redact import redact_json
from ddp_preflight.node.terminal import shown, visible

TEE_PREFIX = re.compile(r"^\[([A-Za-z_]\D*?)(\d+)\]:(.*)$")
STEP = re.compile(r"^\s*step\b\s*[:=#]?\s*(\d+)", re.IGNORECASE)     # nanochat: "step 00004/05000 ..."


@dataclass(frozen=True)
class Line:
    node: str
    rank: int | None           # global rank; None for torchrun's (or the node's) own lines
    local_rank: int | None
    text: str
    time: float                # when it reached the master, epoch seconds

    def prefixed(self) -> str:
        who = f"{self.node} r{self.rank}" if self.rank is not None else self.node
        return f"[{who}] {self.text}"

    def shown(self) -> str:
        """The line for a terminal: the rank's escape sequences shown, not obeyed (its log keeps
        them). The prefix is the launcher's and stays in front: a carriage return in the rank's
        text keeps what the terminal would have shown of that text, never a line without its
        prefix ("[master r1] ..." cannot become a line that seems to be the launcher's)."""
        who = f"{self.node} r{self.rank}" if self.rank is not None else self.node
        return f"[{shown(who)}] {visible(self.text)}"

    @property
    def step(self) -> int | None:
        """N of a "step N ..." line: training progress, for the first-step time and the dashboard."""
        if self.rank is None:
            return None
        found = STEP.match(self.text)
        return int(found.group(1)) if found else None


class Tee:
    """One node's stream of torchrun's `--tee` lines, each rank's lines whole again. torchrun's
    tail reads a rank's log file a line at a time, and at the file's end takes what is there: a
    rank whose output is block-buffered (print() into a pipe or file: 8 KiB at a time) is often
    caught mid-line, and the rest of that line comes later under the same prefix, so the stream
    holds "[default0]:line 0 0012[default0]:34 xxx" (3 of 100,000 lines in one CI run). A prefix
    of the same role inside a line begins another part: the part before it is kept for its rank
    until that rank's line ends. Lines without a prefix (torchrun's own, the node's) pass as they
    are. A rank that itself prints such a prefix inside a line is cut there as well: the stream
    cannot tell the two apart. Fed from the node's one reader thread."""

    def __init__(self) -> None:
        self.pending: dict[str, str] = {}      # "[default0]:" -> the start of a line not yet ended

    def feed(self, raw: str) -> list[str]:
        """The whole lines this raw line completes, each with its prefix."""
        found = TEE_PREFIX.match(raw)
        if not found:
            return [raw]
        role = found.group(1)
        inner = re.compile(r"\[" + re.escape(role) + r"\d+\]:")
        parts = []
        at = 0
        while True:
            head = inner.match(raw, at)
            if head is None:          # not a prefix where one must be: the rest is this part's
                break
            following = inner.search(raw, head.end())
            end = following.start() if following else len(raw)
            parts.append((head.group(0), raw[head.end():end], following is None))
            if following is None:
                break
            at = end
        out = []
        for prefix, text, ended in parts:
            if ended:
                out.append(prefix + self.pending.pop(prefix, "") + text)
            else:
                self.pending[prefix] = self.pending.get(prefix, "") + text
        return out

    def rest(self) -> list[str]:
        """What the stream ended in the middle of: each rank's unended line, as it is."""
        out = [prefix + text for prefix, text in self.pending.items()]
        self.pending.clear()
        return out


def parse(node: str, first_rank: int, raw: str, now: float) -> Line:
    """One line of a node's torchrun; `first_rank`: the global rank of its local rank 0."""
    found = TEE_PREFIX.match(raw)
    if found:
        local = int(found.group(2))
        return Line(node, first_rank + local, local, found.group(3), now)
    return Line(node, None, None, raw, now)


def safe_name(node: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.@-]", "_", node) or "node"


class NodeLogs:
    """The run's log folder: `<node>.log` with every line of that node, prefixed as on the
    terminal and as the rank wrote it; plan.json and result.json. The logs are not the run: the
    first error (a full disk, a folder gone, a link another user put on the way) stops all
    writing, is kept in `failure` ("No space left on device") and told once to `on_failure`;
    nothing here raises.

    The folder is opened once (from the run folder the launcher holds, node/private.py's hold())
    and every file is made relative to it: a symlink swapped in mid-run redirects nothing."""

    def __init__(self, folder: Path, on_failure: Callable[[str], None] | None = None):
        self.folder = Path(folder)
        self.on_failure = on_failure
        self.failure: str | None = None
        self._files: dict[str, TextIO] = {}
        self._place: Folder | None = None
        self._lock = threading.Lock()

    def path(self, node: str) -> Path:
        return self.folder / f"{safe_name(node)}.log"

    def write(self, node: str, text: str) -> None:
        def append() -> None:
            f = self._files.get(node)
            if f is None:
                f = self._files[node] = self._folder().open_file(self.path(node).name, append=True)
            f.write(text + "\n")
        self._guarded(append)

    def write_json(self, name: str, document: dict) -> None:
        def write() -> None:
            with self._folder().open_file(name) as f:
                f.write(json.dumps(document, indent=2) + "\n")
        self._guarded(write)

    def close(self) -> None:
        self._guarded(self._close_files)
        with self._lock:
            if self._place is not None:
                self._place.close()     # a late result.json opens it again, from the held run folder
                self._place = None

    def _folder(self) -> Folder:
        if self._place is None:
            self._place = folder(self.folder)
        return self._place

    def _guarded(self, action: Callable[[], None]) -> None:
        with self._lock:
            if self.failure is not None:
                return
            try:
                action()
                return
            except OSError as exc:
                self.failure = exc.strerror or str(exc)
                try:
                    self._close_files()
                except OSError:
                    pass       # the same disk: their last lines are lost with the rest
        if self.on_failure is not None:
            self.on_failure(self.failure)

    def _close_files(self) -> None:
        files, self._files = list(self._files.values()), {}
        errors = []
        for f in files:
            try:
                f.close()         # a line-buffered file has at most part of a line left to write
            except OSError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]


def keep_evidence(logs: NodeLogs, node: str, rank: int, data: dict) -> None:
    """A rank's evidence into the log folder, for `ddp-preflight explain`: its Flight Recorder
    (flight-rank-N.json) and its torchelastic error file (error-rank-N.json), secrets redacted."""
    if data["kind"] == "flight" and isinstance(data.get("trace"), dict):
        logs.write_json(f"flight-rank-{rank}.json", redact_json(
            {"rank": rank, "node": node, "pid": data.get("pid"), "flight": data["trace"]}))
    elif data["kind"] == "error_file" and isinstance(data.get("document"), dict):
        logs.write_json(f"error-rank-{rank}.json", redact_json({"rank": rank, "node": node, **data["document"]}))
