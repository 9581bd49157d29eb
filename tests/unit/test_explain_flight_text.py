"""torch's Flight Recorder analyzer pasted as text (issue 37): its reports read as the evidence they are
and judged as the live watcher judges Flight Recorders. The recorded outputs are torch 2.13's own
fr_trace on the lab's Gloo dumps (tests/unit/artifacts/pasted/fr-trace/record.py says how each was made);
the variants are what a paste does to them (a launcher's or logger's prefix, markdown's quote, CRLF, a cut
tail) and what runs beside them (NCCL's watchdog lines of the ranks that waited)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_preflight.explain import explain

RECORDED = Path(__file__).parent / "artifacts" / "pasted" / "fr-trace"


def said(tmp_path: Path, text: str) -> tuple | None:
    path = tmp_path / "paste.txt"
    path.write_bytes(text.encode())
    f = explain([str(path)]).finding
    return None if f is None else (f.kind.value, list(f.culprits), f.sure.value, f.cause.value, f.message)


BEHIND = ("rank-behind", [2], "certain", "rank-behind-same-group", "fr-missing-ranks")
MISMATCH = ("collective-mismatch", [2], "likely", "different-collectives", "fr-collective-errors")
UNDECIDED = ("timeout-unknown-root", [], "unknown", "unknown-collect-flight-recorder", "fr-missing-dumps")


@pytest.mark.parametrize("name,answer", [("missing-rank", BEHIND), ("size-mismatch", MISMATCH),
                                         ("type-mismatch", MISMATCH), ("missing-dump", UNDECIDED)])
def test_each_recorded_report_is_what_it_decided(name, answer):
    e = explain([str(RECORDED / f"{name}.txt")])
    f = e.finding
    assert f is not None and (f.kind.value, list(f.culprits), f.sure.value, f.cause.value, f.message) == answer
    if name == "missing-rank":
        assert f.detail == {"seq": 12, "group": "0:default_pg", "op": "all_reduce", "expected": [0, 1, 2, 3],
                            "never_entered": [2]}
    if answer is not UNDECIDED:     # one judge: the verdict names the rank the finding does, as sure
        d = e.diagnosis
        assert d is not None and (d.kind.value, d.culprits, d.certainty.value) == \
            ("deadlock" if answer is BEHIND else "mismatch", (2,), answer[2])
    if name == "missing-dump":     # the analyzer's own assert is the tool's, not a rank's failure
        assert e.diagnosis is None


@pytest.mark.parametrize("prefix", ["0: ", "[2025-03-01 10:00:00,123] INFO ", "> ", "node1: "])
@pytest.mark.parametrize("name,answer", [("missing-rank", BEHIND), ("type-mismatch", MISMATCH)])
def test_a_report_under_any_prefix_or_crlf_says_the_same(tmp_path, prefix, name, answer):
    lines = (RECORDED / f"{name}.txt").read_text().splitlines()
    assert said(tmp_path, "".join(f"{prefix}{line}\r\n" for line in lines)) == answer


def test_several_missing_ranks_are_all_behind(tmp_path):
    text = (RECORDED / "missing-rank.txt").read_text().replace("missing ranks: {2}", "missing ranks: {1, 3}")
    assert said(tmp_path, text) == ("rank-behind", [1, 3], "certain", "rank-behind-same-group", "fr-missing-ranks")


def test_a_report_cut_before_its_ranks_names_no_one(tmp_path):
    head = "".join((RECORDED / "missing-rank.txt").read_text().splitlines(keepends=True)[:4])
    assert said(tmp_path, head) is None or said(tmp_path, head)[1] == []


def test_the_analyzer_decides_over_the_watchdog_lines_of_the_ranks_that_waited(tmp_path):
    # the ranks that issued #12 timed out in it: their watchdog lines alone name no one (all at one op)
    watchdog = "".join(f"[rank{r}]:[E1125 06:22:07.000000000 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught "
                       f"collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=65792, "
                       f"NumelOut=65792, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.\n"
                       for r in (0, 1, 3))
    assert said(tmp_path, watchdog)[:3] == ("timeout-unknown-root", [], "unknown")
    assert said(tmp_path, watchdog + (RECORDED / "missing-rank.txt").read_text()) == BEHIND


def test_the_undecided_sentence_names_the_ranks_whose_dumps_are_missing(tmp_path):
    # utils.py's error_analysis, its else branch, as torch 2.13's logger prints it (the format string's words)
    text = ("We cannot decide what's wrong with this collective entry because we missed FR dumps from ranks ({3}) so "
            "we don't have enough information. If you want to debug further use -j to dump all raw trace\n")
    path = tmp_path / "paste.txt"
    path.write_text(text)
    f = explain([str(path)]).finding
    assert f is not None and (f.message, f.detail) == ("fr-missing-dumps", {"missing_dumps": [3]})
