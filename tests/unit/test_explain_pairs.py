"""Two real pastes run together in one file, where nothing cuts them apart (no banner, date, store or
world size: boundaries.py keeps them one run), never make a surer verdict than either run alone (issue 37):
NCCL's watchdog lines read second to another message are read by process group as when they are first
(watchdog_root.py), never joined into a certain rank; a rank whose end two torchrun tables (or a table and
torchrun's own line) say differently, in another process, node or code, ended in two runs: the ends judge
names candidates, not a certain rank. Tried on pairs drawn from the whole corpus by a seeded generator."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from ddp_preflight.explain import explain
from ddp_preflight.hangwatch.model import Certainty, Kind

PASTED = Path(__file__).parent / "artifacts" / "pasted"
INDEX = json.loads((PASTED / "index.json").read_text())


def _pair(tmp_path: Path, first: str, second: str) -> Path:
    a, b = ((PASTED / f).read_text(errors="replace") for f in (first, second))
    path = tmp_path / "pair.log"
    path.write_text(a + ("" if a.endswith("\n") else "\n") + b)
    return path


def _file(number: str) -> str:
    return next(e["file"] for e in INDEX if e["file"].startswith(number + "-"))


def _said(path: Path) -> tuple | None:
    d = explain([str(path)]).diagnosis
    return None if d is None else (d.kind, d.certainty, tuple(k for k in d.culprits if isinstance(k, int)))


@pytest.mark.parametrize("seed", [37, 2])
def test_no_pair_of_runs_makes_a_certain_rank_behind_that_neither_run_makes(tmp_path, seed):
    draw = random.Random(seed)
    alone: dict[str, tuple | None] = {}
    wrong = []
    for _ in range(300):
        a, b = (e["file"] for e in draw.sample(INDEX, 2))
        said = _said(_pair(tmp_path, a, b))
        if said is None or said[0] is not Kind.DEADLOCK or said[1] is not Certainty.CERTAIN:
            continue
        for f in (a, b):
            if f not in alone:
                alone[f] = _said(PASTED / f)
        if said not in (alone[a], alone[b]):
            wrong.append((a, b, said))
    assert wrong == []


@pytest.mark.parametrize("first,second,said", [
    # watchdog lines of one group, a rank behind (likely), then another run's DataLoader bus error
    ("094", "142", (Kind.DEADLOCK, Certainty.LIKELY, (0,))),
    # watchdog lines of several process groups, then another run's store barrier: no rank
    ("022", "148", (Kind.NETWORK_STALL, Certainty.UNSURE, ())),
    # the terminal-wrapped watchdog lines of two ops, after another run's libuv error: no rank
    ("273", "343", (Kind.NETWORK_STALL, Certainty.UNSURE, ())),
])
def test_watchdog_lines_second_to_another_runs_message_say_what_they_say_first(tmp_path, first, second, said):
    assert _said(_pair(tmp_path, _file(first), _file(second))) == said


@pytest.mark.parametrize("first,second,twice", [
    ("302", "004", {1}),      # rank 1 the root of two tables, on two hosts
    ("210", "080", {3}),      # torchrun's line: local rank 3 SIGKILLed; another run's table: rank 3 exit 1
])
def test_a_rank_that_ended_twice_makes_no_certain_culprit(tmp_path, first, second, twice):
    e = explain([str(_pair(tmp_path, _file(first), _file(second)))])
    d = e.diagnosis
    assert d is not None and (d.kind, d.certainty, d.culprits) == (Kind.EXITED, Certainty.UNSURE, ())
    assert d.candidates and d.unknown_why is not None
    assert d.unknown_why.startswith(f"the paste holds two ends of rank {','.join(map(str, sorted(twice)))} ")
    # each run alone is not so read: its own table says its ends once
    for number in (first, second):
        alone = explain([str(PASTED / _file(number))]).diagnosis
        assert alone is None or "two ends" not in (alone.unknown_why or "")


def test_the_same_table_pasted_twice_is_one_end(tmp_path):
    # the same paste twice (a user pasting their log again): the same processes, the same ends
    path = _pair(tmp_path, _file("004"), _file("004"))
    alone = _said(PASTED / _file("004"))
    assert _said(path) == alone
