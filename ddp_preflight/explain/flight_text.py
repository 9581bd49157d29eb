"""torch's Flight Recorder analyzer pasted as text (torch.distributed.flight_recorder's fr_trace, the
`torchfrtrace` command, torch 2.5+), read into what it decided from every rank's dump: a collective some
ranks never joined ("Not all ranks joining collective, sequence number: 12" ... "missing ranks: {2}"),
a collective whose ranks disagree ("Collective sequence number: 12 has errors" ... "error msg: Culprit rank
2; Error type: COLLECTIVE_TYPE_MISMATCH, ..."), or one it could not decide for want of some ranks' dumps
("... because we missed FR dumps from ranks ({3}) ..."). Judged as the live watcher judges Flight
Recorders (hangwatch/sequence.py): a rank the others' dumps show never entering a collective they issued
is behind, certain (the analyzer says it only where it read the missing ranks' own dumps); two ranks in
different collectives (or sizes, or dtypes) at one sequence number are a mismatch, the rank it names
likely (it is told from the first rank's entry, not a majority); missing dumps name no one. The words are
torch 2.13's builder.py/utils.py/types.py (tests/unit/artifacts/pasted/fr-trace/ holds its output,
recorded here). Pure: lines in, blocks and a judgement out."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ddp_preflight.hangwatch.prefixes import Line
from ddp_preflight.rules import failures
from ddp_preflight.rules.failures import BY_ID, Sure

from .quote import Quote
from .stacks import Judged

FIELD = re.compile(r"^\s*(?P<key>internal record id|group info|collective|missing ranks|total input numel"
                   r"|total output numel|input sizes|output sizes|world size|expected ranks|collective state|error msg"
                   r"|collective stack trace):(?: (?P<value>.*?))?\s*$")
CULPRIT = re.compile(r"Culprit rank (?P<rank>\d+); (?:Error type: )?(?:MatchState\.)?(?P<type>[A-Z_]+)")
RANKS = re.compile(r"\d+")
FOUND_OP = re.compile(r"Culprit rank (?P<rank>\d+); [^;]*?found collective type: '(?P<op>\w+)'")
BLOCKS = 64            # analyzer reports kept (it stops at a group's tenth mismatch itself)
# what the ranks disagree on, in the analyzer's words: each is a mismatch of the collectives they issued;
# a state mismatch (one rank's entry completed, another's not) is not one, and names no one
MISMATCHES = ("COLLECTIVE_TYPE_MISMATCH", "SIZE_OR_SYNTAX_MISMATCH", "COLLECTIVE_DTYPE_MISMATCH")
IDS = {"missing": "fr-missing-ranks", "errors": "fr-collective-errors", "sizes": "fr-collective-errors",
       "undecided": "fr-missing-dumps"}
WHAT = {"fr-missing-ranks": "missing", "fr-collective-errors": "errors", "fr-missing-dumps": "undecided"}


@dataclass
class Analyzed:
    """One report of the analyzer: the collective it is about and what it found."""
    what: str                        # "missing" | "errors" | "sizes" | "undecided"
    seq: int | None
    ranks: tuple[int, ...] = ()      # "missing ranks", or the ranks whose dumps it missed
    culprits: list[tuple[int, str]] = field(default_factory=list)   # (rank, error type) from "error msg"
    found: dict[int, str] = field(default_factory=dict)             # the op a culprit issued instead, where it says
    fields: dict[str, str] = field(default_factory=dict)
    quotes: list[Quote] = field(default_factory=list)


class AnalyzerReader:
    """A file's lines, fed in order: the analyzer's reports in them."""

    def __init__(self, blocks: list[Analyzed]):
        self.blocks = blocks
        self.block: Analyzed | None = None
        self.prefix = ""

    @staticmethod
    def may_be(raw: str) -> bool:
        return "ollective" in raw or "FR dumps" in raw or "dump files" in raw

    def feed(self, line: Line, quote: Quote) -> None:
        text = line.text
        said = next((f for f in failures.find(text) if f.message.id in WHAT), None)    # a report's first line
        if said is not None:
            head = said.message.pattern.search(text)
            assert head is not None
            g = said.groups
            what = "sizes" if "seq2" in g else WHAT[said.message.id]
            seq = g.get("seq") or g.get("seq2")
            ranks = tuple(int(r) for r in RANKS.findall(g.get("ranks") or g.get("ranks2") or ""))
            self.prefix = text[:head.start()]      # what its report's lines all start with (a logger's level, a label)
            self.block = Analyzed(what, int(seq) if seq else None, ranks, quotes=[quote])
            if len(self.blocks) < BLOCKS:
                self.blocks.append(self.block)
            if what == "undecided":
                self.block = None
            return
        if self.block is None:
            return
        if self.prefix and text.startswith(self.prefix):
            text = text[len(self.prefix):]
        found = FIELD.match(text)
        if found is None:
            if text.strip() and not text.startswith(" "):
                self.block = None          # the report's last field is its stack trace's (indented) lines
            return
        key, value = found["key"], found["value"] or ""
        self.block.fields[key] = value
        if key == "missing ranks":
            self.block.ranks = tuple(int(r) for r in RANKS.findall(value))
            self.block.quotes.append(quote)
        elif key == "error msg":
            self.block.culprits = [(int(c["rank"]), c["type"]) for c in CULPRIT.finditer(value)]
            self.block.found = {int(c["rank"]): c["op"] for c in FOUND_OP.finditer(value)}
            self.block.quotes.append(quote)


def judged(blocks: list[Analyzed]) -> tuple[str, Judged] | None:
    """The first report that decides, with its catalogue id (the analyzer reports each group's collectives
    in order: its first is where the ranks first parted)."""
    for block in blocks:
        detail = {"seq": block.seq, "group": block.fields.get("group info"), "op": _op(block.fields.get("collective")),
                  "expected": [int(r) for r in RANKS.findall(block.fields.get("expected ranks", ""))]}
        said = BY_ID[IDS[block.what]]
        if block.what == "missing" and block.ranks:
            return said.id, Judged(said.kind, said.cause, tuple(sorted(block.ranks)), Sure.CERTAIN, said.fix,
                                   {**detail, "never_entered": sorted(block.ranks)})
        mismatched = sorted({rank for rank, kind in block.culprits if kind in MISMATCHES})
        if block.what == "errors" and mismatched:
            return said.id, Judged(said.kind, said.cause, tuple(mismatched), Sure.LIKELY, said.fix,
                                   {**detail, "errors": [f"rank {r}: {k}" for r, k in block.culprits],
                                    "found": {str(r): op for r, op in block.found.items()}})
        if block.what == "sizes":      # all_to_all's totals differ: which rank's, the analyzer cannot tell
            return said.id, Judged(said.kind, said.cause, (), Sure.UNKNOWN, said.fix, detail)
    undecided = next((b for b in blocks if b.what == "undecided"), None)
    if undecided is not None:
        said = BY_ID[IDS["undecided"]]
        return said.id, Judged(said.kind, said.cause, (), said.sure, said.fix, {"missing_dumps": list(undecided.ranks)})
    return None


def _op(collective: str | None) -> str | None:
    """'nccl:all_reduce' -> 'all_reduce'."""
    return collective.split(":")[-1] if collective else None
