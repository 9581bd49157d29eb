"""Flight Recorder dumps pasted as text: the entries people print from a rank's dump (pprint of the
pickle torch's watchdog writes, `{'collective_seq_id': 63, ..., 'state': 'completed'}`, one key a line or
all on one) or paste as JSON (torch's json dump, ddp-preflight's flight-rank-N.json), read into the
entries a dump file gives (records.py), so that the one join of sequence numbers (join.py, hangwatch's)
decides who is behind as it does for the files. An entry is told by its keys, in any order (torch's JSON
keeps insertion order, pprint sorts them): a key it already has begins the next entry. Whose dump it is,
the text says or nothing does: a `"rank": N` key, a dump's file name (`nccl_trace_rank_0`, `trace_3`,
`flight-rank-2`) on a line of its own, or the rank of the line's prefix; entries of no known rank are
not read (never a made-up rank). Pure: lines in, dumps out."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from ddp_preflight.hangwatch.prefixes import Line

from .quote import Quote

# the keys join.py reads, with the value as Python's repr or JSON writes it
KEY = re.compile(r"""['"](?P<key>collective_seq_id|profiling_name|state|is_p2p|process_group|record_id|input_sizes)"""
                 r"""['"]\s*:\s*(?P<value>\d+|'[^']*'|"[^"]*"|True|False|true|false|\([^)]*\)|\[[^\]]*\](?:\])?)""")
RANK_KEY = re.compile(r"""^\s*\{?\s*['"]rank['"]\s*:\s*(?P<rank>\d+)\s*,?\s*$""")
DUMP_NAME = re.compile(r"(?:^|[/\s])(?:nccl_trace_rank_|trace_|flight-rank-|fr_dump_rank_)(?P<rank>\d+)(?:\.json)?\b")
DICT_LINE = tuple("'\"{}[](),-0123456789")   # how a line inside a printed entry starts (a key, a value, a bracket)
DUMPS = 64               # ranks kept
ENTRIES = 2000           # entries kept per rank (torch's buffer's usual size)


@dataclass
class PastedDump:
    """One rank's entries as pasted."""
    rank: int
    entries: list[dict] = field(default_factory=list)
    quote: Quote | None = None


class DumpReader:
    """A file's lines, fed in order: the dumps in them, by rank."""

    def __init__(self) -> None:
        self.dumps: dict[int, PastedDump] = {}
        self.rank: int | None = None          # whose entries come next
        self.entry: dict | None = None

    def wants(self, raw: str) -> bool:
        """A line that may name a dump or hold an entry's keys (inside an entry: any line)."""
        return self.entry is not None or "_seq_id" in raw or "trace_" in raw or "flight-rank-" in raw \
            or "rank\"" in raw or "rank'" in raw

    def feed(self, line: Line, quote: Quote) -> None:
        text = line.text
        named = RANK_KEY.match(text) or DUMP_NAME.search(text) if "_seq_id" not in text else None
        if named is not None:
            self._to(int(named["rank"]))
            return
        keys = list(KEY.finditer(text))
        if not keys:
            if text.strip()[:1] not in DICT_LINE:
                self.entry = None         # a line no dump prints: the entries ended
            return
        if line.rank is not None and line.rank != self.rank:
            self._to(line.rank)
        if self.rank is None:
            return
        dump = self.dumps.get(self.rank)
        if dump is None:
            if len(self.dumps) >= DUMPS:
                return
            dump = self.dumps[self.rank] = PastedDump(self.rank, quote=quote)
        for found in keys:
            key, value = found["key"], _value(found["value"])
            if self.entry is None or key in self.entry:
                self.entry = {}
                if len(dump.entries) < ENTRIES:
                    dump.entries.append(self.entry)
            self.entry[key] = value

    def _to(self, rank: int) -> None:
        self.rank, self.entry = rank, None


def _value(text: str) -> object:
    """A value as Python's repr or JSON wrote it (a literal only: never evaluated as code)."""
    text = {"true": "True", "false": "False"}.get(text, text)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text.strip("'\"")
