"""The watcher's stall logic, replaying what real agents sent during lab runs
(tests/unit/artifacts/agent/*.jsonl, recorded by record.py there) on a clock the test drives."""

import json
from pathlib import Path

from hangwatch import stall
from hangwatch.watch import Watcher, WatchTarget

AGENT = Path(__file__).parent / "artifacts" / "agent"


def replay(name, tmp_path, until=None):
    lines = (AGENT / f"{name}.jsonl").read_text().splitlines()
    header, records = json.loads(lines[0]), [json.loads(l) for l in lines[1:]]
    now = [0.0]
    events = []
    watcher = Watcher([WatchTarget("master", "python"), WatchTarget("worker1", "python")], clock=lambda: now[0],
                      on_event=events.append, incident_dir=str(tmp_path / "incidents"))
    for record in records:
        if until is not None and record["at"] > until:
            break
        while now[0] + 0.25 <= record["at"]:
            now[0] += 0.25
            watcher.tick()
            for e in events:
                e.data.setdefault("at", now[0])
        now[0] = record["at"]
        watcher._message(record["node"], record["msg"])
        for e in events:
            e.data.setdefault("at", now[0])
    return header, watcher, events


def test_the_recorded_deadlock_is_named_with_rank_and_line_within_the_threshold(tmp_path):
    header, watcher, events = replay("leave", tmp_path)
    found = [e for e in events if e.kind == "diagnosis"]
    assert found, [e.text for e in events]
    first = found[0]
    diagnosis = first.snapshot.diagnosis
    assert diagnosis.kind == "deadlock" and diagnosis.guilty == [header["rank"]] == [3]
    assert "rank 3 left the loop: idle at hang_train.py:80 (main)" in diagnosis.summary
    assert first.data["at"] - header["fault_at"] <= stall.DEFAULT_THRESHOLD + 2
    assert first.data["at"] - header["fault_at"] >= stall.DEFAULT_THRESHOLD - 1     # not before the stall is long
    # One bundle for the stall; the recording's end (the test stopped the job: SIGTERM) is no new failure.
    assert len([e for e in events if e.kind == "incident"]) == 1
    assert [e.kind for e in events].count("diagnosis") == 1


def test_the_recorded_straggler_is_never_a_hang(tmp_path):
    header, watcher, events = replay("straggle", tmp_path)
    kinds = [e.kind for e in events]
    assert "diagnosis" not in kinds and "incident" not in kinds, [e.text for e in events]
    straggler = next(e for e in events if e.kind == "straggler")
    assert straggler.snapshot.diagnosis.guilty == [header["rank"]] == [0]
    assert "rank 0 is computing at hang_train.py:" in straggler.text
    assert "resumed" in kinds[kinds.index("straggler"):]


def test_before_the_threshold_nothing_is_named(tmp_path):
    header, watcher, events = replay("leave", tmp_path, until=None)
    header, early, early_events = replay("leave", tmp_path, until=header["fault_at"] + stall.DEFAULT_THRESHOLD - 1.5)
    assert not [e for e in early_events if e.kind in ("diagnosis", "straggler")]
    # ... yet the stacks were already in hand for every waiting rank: taken at half the threshold.
    assert all(r.state in ("collective", "idle") for r in early.snapshot().ranks), early.snapshot().ranks


def test_the_stall_plan():
    assert stall.plan(3.0, 8.0, False, None, None) == stall.Plan(False, False)         # short pauses: nothing
    assert stall.plan(4.0, 8.0, False, None, None) == stall.Plan(True, False)          # half way: stacks
    assert stall.plan(5.0, 8.0, False, None, 1.0) == stall.Plan(False, False)          # asked, pending
    assert stall.plan(8.0, 8.0, True, 3.0, None) == stall.Plan(False, True)            # covered: name it
    assert stall.plan(8.0, 8.0, False, 3.0, None) == stall.Plan(True, False)           # a rank went idle since
    assert stall.plan(30.0, 8.0, True, 11.0, None) == stall.Plan(True, True)           # a long stall: look again
    assert stall.plan(9.0, 8.0, False, 3.0, 20.0) == stall.Plan(True, False)           # a lost answer: ask again


def test_a_rank_caught_as_a_zombie_is_reported_gone_once_with_its_signal(tmp_path):
    # The message order a busy node produced (seen in bench/hangwatch_detection.py): a sample
    # catches the zombie before the pidfd notice comes.
    events, now = [], [0.0]
    watcher = Watcher([WatchTarget("master", "python")], clock=lambda: now[0], on_event=events.append,
                      incident_dir=str(tmp_path))
    for msg in ({"type": "rank", "pid": 111, "rank": 0, "local_rank": 0, "world_size": 1, "env": {}},
                {"type": "sample", "t": 1.0, "ranks": [{"pid": 111, "cpu": 50.0}], "gone": []},
                {"type": "sample", "t": 2.0, "ranks": [{"pid": 111, "state": "Z", "exit": 15}], "gone": []},
                {"type": "exit", "pid": 111, "t": 2.1, "code": 15},
                {"type": "sample", "t": 3.0, "ranks": [], "gone": [111]}):
        now[0] += 1
        watcher._message("master", msg)
    gone = [e for e in events if e.kind == "rank-gone"]
    assert len(gone) == 1 and gone[0].data["exit"] == "signal 15", [e.text for e in events]
