"""NCCL's watchdog line is evidence of a timed-out collective only if the rank did not go on (issue
35): a rank that logged it and then printed later steps kept training (the watchdog's word was not
its end), so its ending is judged by how it really ended. One rule for the live watcher's reading of
a launched rank's output (RankError, then RankStepped) as for any reader that gives the judge the
same order. The watchdog line is the real one from an H100 (tests/unit/artifacts/logs/nccl-h100)."""

from __future__ import annotations

from pathlib import Path

from ddp_preflight.hangwatch.model import Reason
from ddp_preflight.hangwatch.text import summary
from ddp_preflight.hangwatch.tracebacks import Reader
from ddp_preflight.hangwatch.watch import Watcher, WatchTarget
from ddp_preflight.transport import LocalNode

from .test_hangwatch_exits import OWN

H100 = Path(__file__).parent / "artifacts" / "logs" / "nccl-h100" / "hung-train-tail.log"


def _read(text: str):
    reader = Reader()
    found = [seen for line in text.splitlines() if (seen := reader.feed(line)) is not None]
    return found[-1]


def _run(tmp_path, went_on: bool):
    """Ranks 0,1 under one torchrun on master: rank 0 logs NCCL's watchdog line, then (went_on) prints
    two more steps; rank 1 then raises its own error and ends (code 1), rank 0 ends with code 1 after it."""
    events, now = [], [0.0]
    watcher = Watcher([WatchTarget(LocalNode("master", "python"))], clock=lambda: now[0], wall=lambda: 1.0 + now[0],
                      on_event=events.append, incident_dir=str(tmp_path))
    for pid, rank in ((100, 0), (101, 1)):
        watcher.receive("master", {"type": "rank", "pid": pid, "ppid": 90, "rank": rank, "local_rank": rank,
                                   "world_size": 2, "master": "127.0.0.1:29500", "env": {}})
    watcher.receive("master", {"type": "sample", "t": 1.0, "gone": [],
                               "ranks": [{"pid": 100, "cpu": 90.0}, {"pid": 101, "cpu": 90.0}]})
    watchdog = [line for line in H100.read_text().splitlines() if "Watchdog caught" in line][0]
    watcher.rank_error("master", 0, _read(watchdog))
    if went_on:
        for step in (41, 42):
            now[0] += 1.0
            watcher.rank_stepped("master", 0, step)
    watcher.rank_error("master", 1, _read(OWN))
    for pid, t in ((101, 10.0), (100, 10.5)):
        now[0] += 0.1
        watcher.receive("master", {"type": "exit", "pid": pid, "t": t, "code": 256})
    for _ in range(20):
        now[0] += 0.25
        watcher.tick()
    return [e.snapshot.diagnosis for e in events if e.kind == "diagnosis"]


def test_a_watchdog_line_the_rank_went_on_after_is_withdrawn(tmp_path):
    # Before: the watchdog's word stood as rank 0's end: "rank 1 ... never entered" (it timed out waiting
    # for rank 1), though rank 0 trained on after it and rank 1 raised its own error.
    [found] = _run(tmp_path / "on", went_on=True)
    assert (found.kind, list(found.culprits), found.reason, found.certainty) == \
        ("exited", [1], Reason.RAISED, "certain"), summary(found)


def test_a_watchdog_line_the_rank_did_not_go_on_after_stands(tmp_path):
    [found] = _run(tmp_path / "stuck", went_on=False)
    assert (found.kind, list(found.culprits), list(found.candidates), found.reason, found.certainty) == \
        ("exited", [1], [], Reason.BEHIND, "likely"), summary(found)
