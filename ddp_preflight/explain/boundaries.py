"""Runs concatenated in one pasted file, told apart by evidence (runs.py does it for separate files):
a file is cut where a launcher starts again after a failure was already said (torchrun's and
torch.distributed.run's banner, its elastic agent's launch configs, DeepSpeed's runner and launcher),
and where its dates go back or jump days ahead (unless its lines carry two clocks); the pieces are
runs apart only where their own lines say so (different stores, world sizes, dates days apart:
runs.py's Said), else one run, as before. Several nodes' outputs of one run pasted one after the
other (a banner and dates going back at each) stay one run: their store is the same, or nothing
says they differ. Only a paste (an input read whole, shorter than lines.py's block) is cut; stdin is
read once and is not."""

from __future__ import annotations

import io
import re

from ddp_preflight.hangwatch.prefixes import normalize
from ddp_preflight.node.bounded import Skipped, read_regular
from ddp_preflight.rules.failures import ANY_WORD

from . import logs
from .gather import exits_from_tables
from .inputs import Input, InputKind
from .lines import BLOCK
from .runs import DATE, Said, _day, said_in
from .seen import Gathered

# A launcher's first lines: torchrun (torch 1.9+: its OMP banner, its agent's configs), DeepSpeed's runner and launcher
BANNER = re.compile(r"Setting OMP_NUM_THREADS environment variable for each process|Starting elastic_operator with "
                    r"launch configs|\[runner\.py:\d+:main\] cmd = |\[launch\.py:\d+:main\] WORLD INFO DICT")


def cuts(lines: list[str]) -> list[int]:
    """Where pieces begin (0-based line indexes, the first always 0): a launcher's banner after a line
    with a failure's words, a date earlier than one before it or days after it (runs.py's "days apart")."""
    starts, failed, latest = [0], False, None
    dated = not _two_clocks(lines)
    for i, line in enumerate(lines):
        day = _day(normalize(line).time) if dated and any(c.isdigit() for c in line[:40]) else None
        if i and (failed and BANNER.search(line) or day is not None and latest is not None and
                  not 0 <= (day - latest).days <= 1):
            starts.append(i)
            failed, latest = False, None
        if day is not None:
            latest = day if latest is None else max(latest, day)
        failed = failed or ANY_WORD.search(line) is not None or "Traceback" in line
    return starts


def split_runs(found: list[Input]) -> list[Gathered] | None:
    """One pasted log that holds several runs: what each run's pieces said; None when it holds one."""
    if len(found) != 1 or found[0].kind is not InputKind.LOG or found[0].path == "-":
        return None
    path = found[0].path
    try:
        data = read_regular(path, BLOCK - 1)
    except (Skipped, OSError):
        return None
    lines = data.decode("utf-8", "replace").split("\n")
    starts = cuts(lines)
    if len(starts) < 2:
        return None
    pieces = list(zip(starts, [*starts[1:], len(lines)], strict=True))
    said = [_said(path, lines, a, b) for a, b in pieces]
    if _two_clocks(lines):
        for one in said:
            one.days.clear()
    runs: list[list[int]] = [[0]]
    for k in range(1, len(pieces)):
        if any(said[k].other_run(said[j]) for j in runs[-1]):
            runs.append([k])
        else:
            runs[-1].append(k)
    if len(runs) < 2:
        return None
    return [_gather(path, lines, [pieces[k] for k in run]) for run in runs]


def _two_clocks(lines: list[str]) -> bool:
    """A line with two dates (a log collector's or a logger's, and the program's own): the file's
    dates say nothing of which run a line is of."""
    return any(len(set(DATE.findall(line))) > 1 for line in lines if line.count("-") >= 4)


def _gather(path: str, lines: list[str], pieces: list[tuple[int, int]]) -> Gathered:
    """A run's pieces read as one log, each line with its number in the file (blank lines stand for
    the others: a reader skips them)."""
    keep = set().union(*(range(a, b) for a, b in pieces))
    text = "\n".join(line if i in keep else "" for i, line in enumerate(lines))
    g = Gathered()
    g.read.append(path)
    logs.read_log(g, path, stream=io.BytesIO(text.encode()))
    exits_from_tables(g)
    return g


def _said(path: str, lines: list[str], a: int, b: int) -> Said:
    return said_in(_gather(path, lines, [(a, b)]).messages, {path})
