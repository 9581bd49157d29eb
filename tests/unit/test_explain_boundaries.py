"""Runs concatenated in one pasted file are explained each alone where their own lines say they are
different runs (explain/boundaries.py): cut where a launcher starts again after a failure, or where
dates go back or jump days ahead; apart only where the pieces name different stores, world sizes or
days (runs.py's evidence). The pieces are real pastes of the corpus (tests/unit/artifacts/pasted/)."""

from __future__ import annotations

from pathlib import Path

from ddp_preflight.explain import explain
from ddp_preflight.explain.boundaries import cuts

PASTED = Path(__file__).parent / "artifacts" / "pasted"
RDZV = (PASTED / "016-pytorch-rendezvous-connection-error.log").read_text()        # torchrun, store 192.0.0.1:1234
PORT = (PASTED / "035-dist-kd-torchrun-master-port-in-use.log").read_text()        # torchrun, port 25641 in use
EXTRA = (PASTED / "072-metaseq-waiting-barrier-extra-worker.log").read_text()      # 2022-05-10, world_size=2
HALF = (PASTED / "074-megatron-ds-store-barrier-half-joined.log").read_text()      # world_size=8


def _explain(tmp_path: Path, text: str):
    log = tmp_path / "paste.txt"
    log.write_text(text)
    return explain([str(log)])


def _answer(e) -> tuple | None:
    f = e.finding
    return None if f is None else (f.kind.value, f.cause.value, f.culprits, f.sure.value)


def _dated(text: str, date: str) -> str:
    return "\n".join(f"{date} 10:00:00,123 {line}" if line else line for line in text.split("\n"))


def test_two_torchrun_runs_with_other_stores_are_explained_each_alone(tmp_path):
    e = _explain(tmp_path, RDZV + "\n" + PORT)
    assert e.diagnosis is None and e.finding is None          # nothing decided across the two
    assert [_answer(r) for r in e.runs] == [_answer(_explain(tmp_path, RDZV)), _answer(_explain(tmp_path, PORT))]
    assert [_answer(r) for r in e.runs] == [("store-timeout", "store-unreachable", (), "likely"),
                                            ("port-in-use", "master-port-in-use", (), "certain")]
    assert not e.ok


def test_the_quotes_of_each_run_keep_their_line_numbers_in_the_file(tmp_path):
    e = _explain(tmp_path, RDZV + "\n" + PORT)
    first_of_second = RDZV.count("\n") + 2
    assert min(q.line for q in e.runs[1].finding.quotes) >= first_of_second
    assert max(q.line for q in e.runs[0].finding.quotes) < first_of_second


def test_one_runs_two_nodes_pasted_one_after_the_other_stay_one_run(tmp_path):
    # the same store in both pieces (each node's torchrun printed its banner): one run
    assert _explain(tmp_path, RDZV + "\n" + RDZV).runs == ()


def test_dates_that_go_back_cut_and_other_world_sizes_make_two_runs(tmp_path):
    e = _explain(tmp_path, _dated(HALF, "2024-05-01") + "\n" + EXTRA)
    assert [_answer(r) for r in e.runs] == [_answer(_explain(tmp_path, HALF)), _answer(_explain(tmp_path, EXTRA))]


def test_a_run_across_midnight_is_not_cut():
    lines = ["2024-05-01 23:59:59 step 10", "2024-05-02 00:00:01 RuntimeError: x", "2024-05-02 00:00:02 step 11"]
    assert cuts(lines) == [0]


def test_where_pieces_begin():
    lines = ["Setting OMP_NUM_THREADS environment variable for each process to be 1", "step 1",
             "RuntimeError: Connection reset by peer",
             "Setting OMP_NUM_THREADS environment variable for each process to be 1",    # a new launch: cut
             "Setting OMP_NUM_THREADS environment variable for each process to be 1",    # no failure since: same
             "2024-05-03 10:00:00 step 2", "2024-05-01 10:00:00 step 1"]                 # back in time: cut
    assert cuts(lines) == [0, 3, 6]
