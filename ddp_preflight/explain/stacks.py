"""py-spy dumps pasted as text, read into the evidence the live watcher reads from `py-spy dump
--json`: each process's threads and frames, then its main thread classified by hangwatch's one
classifier (hangwatch/classify.py: which collective it waits in, or init_process_group, or where
else it is). py-spy 0.3+ prints `Process 2816: CMD`, `Thread 4888 (idle): "MainThread"` and
`    backward (torch/_tensor.py:521)`; 0.1/0.2 printed `Thread 0x7F4AA36D9700 (active)` and tab-
indented frames; `--locals` adds `Arguments:`/`Locals:` blocks, skipped here. A paste holds no
CPU: a rank is told by its stack alone. Pure: lines in, dumps out."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ddp_preflight.hangwatch.classify import RankState, classify
from ddp_preflight.hangwatch.model import RankStatus
from ddp_preflight.hangwatch.prefixes import Line
from ddp_preflight.rules.failures import BY_ID, Cause, FailureKind, Sure
from ddp_preflight.rules.fix import Fix

from .quote import Quote

PROCESS = re.compile(r"^Process (?P<pid>\d+): ")
THREAD = re.compile(r"^Thread (?P<id>0x[0-9A-Fa-f]+|\d+) \((?P<state>idle|active|gil)[^)]*\)(?:: \"(?P<name>[^\"]*)\")?")
FRAME = re.compile(r"^[ \t]+(?P<name>\S[^(]*?) \((?P<file>[^()]+?):(?P<line>\d+)\)\s*$")
# A prefix the normalizer left before a dump's own words (a host, "rank 1 |", srun's label before an indented
# frame): whatever ends in ":", "|", "]" or ">" before py-spy's first word; its lines then all carry it
PREFIXED = re.compile(r"^(?P<prefix>[^\t]{1,80}?[:|\]>] ?)(?=Process \d+: |Thread (?:0x[0-9A-Fa-f]+|\d+) \()")
PREFIX_RANK = re.compile(r"^\s*(?P<task>\d+):\s*$|\brank\s*[:=]?\s*(?P<rank>\d+)\b", re.IGNORECASE)
STACKS = 64            # processes kept (a paste of a whole node's dumps)
FRAMES = 200           # frames kept per thread


@dataclass
class Dumped:
    """One process's dump as pasted: py-spy's JSON shape, and the lines it rests on."""
    pid: int | None
    rank: int | None = None          # the rank a prefix said (torch's [rank1]:, srun's 1: ...)
    threads: list[dict] = field(default_factory=list)
    quotes: list[Quote] = field(default_factory=list)

    def state(self) -> RankState:
        """Its main thread's: by name, else (py-spy 0.2 names none) the one that runs a `<module>`."""
        threads = self.threads
        if not any(t["thread_name"] for t in threads):
            threads = sorted(threads, key=lambda t: not (t["frames"] and t["frames"][-1]["name"] == "<module>"))
        return classify(threads, None)


class StackReader:
    """A file's lines, fed in order: the dumps in them."""

    def __init__(self, dumps: list[Dumped]):
        self.dumps = dumps
        self.process: Dumped | None = None
        self.thread: dict | None = None
        self.prefix = ""       # what every line of the dump being read starts with, the normalizer left or not

    @staticmethod
    def may_be(raw: str) -> bool:
        return "Thread " in raw or "Process " in raw

    def feed(self, line: Line, quote: Quote) -> None:
        """`line`: as ddp_preflight/hangwatch/prefixes.py's normalize read it."""
        text, rank = line.text, line.rank
        if PROCESS.match(text) or THREAD.match(text.lstrip()):
            # the normalizer took a prefix off the dump's words: its frames' lines may keep it (srun's "0: "
            # before an indented line)
            self.prefix = quote.text[:len(quote.text) - len(text)] if quote.text.endswith(text) else ""
        elif (prefixed := PREFIXED.match(text)) is not None:     # a prefix the normalizer left (a host's, "rank 1 |")
            text, self.prefix = text[prefixed.end():], prefixed["prefix"]
            rank = rank if rank is not None else _rank(self.prefix)
        elif self.thread is not None and self.prefix and not FRAME.match(text):
            text = next((t[len(self.prefix):] for t in (text, quote.text) if t.startswith(self.prefix)), text)
        process = PROCESS.match(text)
        if process is not None:
            self._new(int(process["pid"]), rank, quote)
            return
        thread = THREAD.match(text.lstrip())
        if thread is not None:
            if self.process is None or self.process.threads and self.process.pid is None and _main(thread) \
                    or rank is not None and rank != self.process.rank:
                self._new(None, rank, quote)   # no Process line: a second MainThread, another rank's prefix
            assert self.process is not None
            tid = thread["id"]
            self.thread = {"thread_id": int(tid, 16) if tid.startswith("0x") else int(tid),
                           "os_thread_id": None if tid.startswith("0x") else int(tid), "pid": self.process.pid,
                           "thread_name": thread["name"], "active": thread["state"] != "idle", "frames": []}
            self.process.threads.append(self.thread)
            if len(self.process.quotes) < 4:
                self.process.quotes.append(quote)
            return
        frame = FRAME.match(text) if self.thread is not None else None
        if frame is not None and self.thread is not None and len(self.thread["frames"]) < FRAMES:
            file = frame["file"].strip()
            self.thread["frames"].append({"name": frame["name"].strip(), "filename": file,
                                          "short_filename": _short(file), "line": int(frame["line"])})
        elif frame is None and not text[:1].isspace() and text.strip():
            self.thread = None        # a line that is no frame ends the thread (Arguments:/Locals: are indented)

    def _new(self, pid: int | None, rank: int | None, quote: Quote) -> None:
        self.thread = None
        if len(self.dumps) < STACKS:
            self.process = Dumped(pid, rank, quotes=[quote])
            self.dumps.append(self.process)
        else:
            self.process = Dumped(pid, rank)        # read, not kept


def _rank(prefix: str) -> int | None:
    """The rank a prefix says: srun's task label ("3: ", one task a rank), or its word ("rank 3 |")."""
    said = PREFIX_RANK.search(prefix)
    return None if said is None else int(said["task"] or said["rank"])


def _main(thread: re.Match) -> bool:
    return thread["name"] == "MainThread"


def _short(file: str) -> str:
    """py-spy's short_filename: relative to site-packages (as the text dump already is, mostly)."""
    for folder in ("site-packages/", "dist-packages/"):
        if folder in file:
            return file.split(folder, 1)[1]
    return file


@dataclass(frozen=True)
class Judged:
    """What the dumps say together, in a finding's fields."""
    kind: FailureKind
    cause: Cause
    culprits: tuple[int, ...]
    sure: Sure
    fix: Fix | None
    detail: dict


def judged(dumps: list[Dumped]) -> Judged | None:
    """Every process in init_process_group: some rank never joined (which, a dump does not say). Ranks
    known by their prefixes, all but one waiting in collectives and that one elsewhere: it is behind
    (likely: a paste may not hold every rank). Else the waits alone: unknown, with what to collect."""
    seen = [(d, d.state()) for d in dumps if d.threads]
    if not seen:
        return None
    detail = {"stacks": [{"pid": d.pid, "rank": d.rank, "state": s.state.value, "op": s.op,
                          "line": s.frame.where if s.frame else None} for d, s in seen]}
    if all(s.state is RankStatus.RENDEZVOUS for _, s in seen):
        return Judged(FailureKind.STORE_TIMEOUT, Cause.NEVER_JOINED, (), Sure.LIKELY, BY_ID["store-wait-timeout"].fix,
                      detail)
    waiting = [(d, s) for d, s in seen if s.state is RankStatus.COLLECTIVE]
    elsewhere = [(d, s) for d, s in seen if s.state not in (RankStatus.COLLECTIVE, RankStatus.RENDEZVOUS)]
    if waiting and len(elsewhere) == 1 and elsewhere[0][0].rank is not None and all(d.rank is not None for d, _ in waiting):
        rank = elsewhere[0][0].rank
        assert rank is not None
        return Judged(FailureKind.RANK_BEHIND, Cause.BEHIND, (rank,), Sure.LIKELY, None, detail)
    return Judged(FailureKind.TIMEOUT_UNKNOWN_ROOT, Cause.COLLECT_FLIGHT_RECORDER, (), Sure.UNKNOWN,
                  BY_ID["watchdog"].fix, detail)
