"""The watcher's stall logic, replaying what real agents sent during lab runs
(tests/unit/artifacts/agent/*.jsonl, recorded by record.py there) on a clock the test drives."""

import json
from pathlib import Path

from ddp_preflight.hangwatch import stall
from ddp_preflight.hangwatch.text import summary
from ddp_preflight.hangwatch.watch import Watcher, WatchTarget
from ddp_preflight.transport import LocalNode

AGENT = Path(__file__).parent / "artifacts" / "agent"


def replay(name, tmp_path, until=None, threshold=stall.DEFAULT_THRESHOLD, lost=lambda record: False, then=(),
           folder=None, **options):
    """Feed a recording to a real Watcher on a driven clock. lost(record): a message that never
    arrives (a killed agent, a dead link); then: (at, action(watcher)) pairs, done at that time;
    folder: where NAME.jsonl is (a recording derived in a test's own folder; default AGENT);
    options: the Watcher's own (planned=...)."""
    lines = ((folder or AGENT) / f"{name}.jsonl").read_text().splitlines()
    header, records = json.loads(lines[0]), [json.loads(line) for line in lines[1:]]
    records = sorted([r for r in records if not lost(r)] + [{"at": at, "do": do} for at, do in then],
                     key=lambda r: r["at"])
    now = [0.0]
    events = []
    # The master's wall clock as it was when recorded: the agents' stamps are read against it.
    hello = next(r for r in records if "msg" in r and r["msg"].get("type") == "hello")
    began = hello["msg"]["time"] - hello["at"]
    watcher = Watcher([WatchTarget(LocalNode("master", "python")), WatchTarget(LocalNode("worker1", "python"))],
                      clock=lambda: now[0], wall=lambda: began + now[0],
                      threshold=threshold, on_event=events.append, incident_dir=str(tmp_path / "incidents"), **options)
    for record in records:
        if until is not None and record["at"] > until:
            break
        while now[0] + 0.25 <= record["at"]:
            now[0] += 0.25
            watcher.tick()
            for e in events:
                e.data.setdefault("at", now[0])
        now[0] = record["at"]
        if "do" in record:
            record["do"](watcher)
        else:
            watcher.receive(record["node"], record["msg"])
        for e in events:
            e.data.setdefault("at", now[0])
    return header, watcher, events


def test_the_recorded_deadlock_is_named_with_rank_and_line_within_the_threshold(tmp_path):
    header, watcher, events = replay("leave", tmp_path)
    found = [e for e in events if e.kind == "diagnosis"]
    assert found, [e.text for e in events]
    first = found[0]
    diagnosis = first.snapshot.diagnosis
    assert (diagnosis.kind, diagnosis.culprits, diagnosis.candidates, diagnosis.reason, diagnosis.certainty) == \
        ("deadlock", [header["rank"]], [], "left-loop", "certain") and header["rank"] == 3
    assert summary(diagnosis) == "rank 3 left the loop: idle at hang_train.py:149 (main); ranks 0,1,2 wait in all_reduce"
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
    assert straggler.snapshot.diagnosis.culprits == [header["rank"]] == [0]
    assert "rank 0 is computing at hang_train.py:43 (compute);" in straggler.text, straggler.text     # compute()'s line then
    assert "resumed" in kinds[kinds.index("straggler"):]


def test_before_the_threshold_nothing_is_named(tmp_path):
    header, watcher, events = replay("leave", tmp_path, until=None)
    header, early, early_events = replay("leave", tmp_path, until=header["fault_at"] + stall.DEFAULT_THRESHOLD - 1.5)
    assert not [e for e in early_events if e.kind in ("diagnosis", "straggler")]
    # ... yet the stacks were already in hand for every waiting rank: taken at half the threshold.
    assert all(r.state in ("collective", "idle") for r in early.snapshot().ranks), early.snapshot().ranks


def test_the_stall_plan():
    assert stall.plan(3.0, 8.0, False, None, None) == stall.StallStep(False, False)         # short pauses: nothing
    assert stall.plan(4.0, 8.0, False, None, None) == stall.StallStep(True, False)          # half way: stacks
    assert stall.plan(5.0, 8.0, False, None, 1.0) == stall.StallStep(False, False)          # asked, pending
    assert stall.plan(8.0, 8.0, True, 3.0, None) == stall.StallStep(False, True)            # covered: name it
    assert stall.plan(8.0, 8.0, False, 3.0, None) == stall.StallStep(True, False)           # a rank went idle since
    assert stall.plan(30.0, 8.0, True, 11.0, None) == stall.StallStep(True, True)           # a long stall: look again
    assert stall.plan(9.0, 8.0, False, 3.0, 20.0) == stall.StallStep(True, False)           # a lost answer: ask again


def test_a_rank_caught_as_a_zombie_is_reported_gone_once_with_its_signal(tmp_path):
    # The message order a busy node produced (seen in bench/hangwatch_detection.py): a sample
    # catches the zombie before the pidfd notice comes.
    events, now = [], [0.0]
    watcher = Watcher([WatchTarget(LocalNode("master", "python"))], clock=lambda: now[0], on_event=events.append,
                      incident_dir=str(tmp_path))
    for msg in ({"type": "rank", "pid": 111, "rank": 0, "local_rank": 0, "world_size": 1, "env": {}},
                {"type": "sample", "t": 1.0, "ranks": [{"pid": 111, "cpu": 50.0}], "gone": []},
                {"type": "sample", "t": 2.0, "ranks": [{"pid": 111, "state": "Z", "exit": 15}], "gone": []},
                {"type": "exit", "pid": 111, "t": 2.1, "code": 15},
                {"type": "sample", "t": 3.0, "ranks": [], "gone": [111]}):
        now[0] += 1
        watcher.receive("master", msg)
    gone = [e for e in events if e.kind == "rank-gone"]
    # The exit is data, as the JSON holds it (ExitStatus): signal 15, no code.
    assert len(gone) == 1 and gone[0].data["exit"] == {"code": None, "signal": 15}, [e.text for e in events]


def test_an_agent_lost_while_its_rank_straggles_gives_no_deadlock_and_no_bundle(tmp_path):
    # The recorded straggler is rank 0 on master; its agent dies 2.5 s into the straggle (as
    # with kill -9: its messages stop and its channel closes). Ranks 2,3 then wait in all_reduce
    # for a rank nobody can see, which may be computing: never a hang that stops the run.
    header, watcher, events = replay("straggle", tmp_path, lost=lambda r: r["node"] == "master" and r["at"] > 18.0,
                                     then=[(18.0, lambda w: w.closed("master", "killed"))])
    kinds = [e.kind for e in events]
    assert "diagnosis" not in kinds and "incident" not in kinds, [e.text for e in events]
    assert not (tmp_path / "incidents").exists()
    said = next(e for e in events if e.snapshot is not None and e.snapshot.diagnosis is not None)
    assert said.snapshot.diagnosis.kind == "unseen" and said.snapshot.diagnosis.culprits == []
    assert said.text == ("ranks 2,3 wait in all_reduce; ranks 0,1 unknown (not watched: master's agent is gone): "
                         "a hang cannot be told from a straggler")
    lost = [e for e in events if e.kind == "node" and e.data["status"] == "lost"]
    assert len(lost) == 1 and "master: the agent stopped (killed)" in lost[0].text


def _worker1_lost(events):
    return [e for e in events if e.kind == "node" and e.data["node"] == "worker1" and e.data["status"] == "lost"]


def test_a_silent_agent_is_a_lost_node_within_seconds_whatever_the_threshold(tmp_path):
    # worker1's messages stop at 10 s with no close (its link is down); rank 3 there leaves the loop at 14.6 s.
    silent = lambda r: r["node"] == "worker1" and r["at"] > 10.0      # noqa: E731
    heard = max(r["at"] for r in map(json.loads, (AGENT / "leave.jsonl").read_text().splitlines()[1:])
                if r["node"] == "worker1" and r["at"] <= 10.0)
    seen = {}
    for threshold in (8.0, 20.0):
        header, watcher, events = replay("leave", tmp_path / str(threshold), threshold=threshold, lost=silent)
        lost = _worker1_lost(events)
        assert len(lost) == 1, [e.text for e in events]
        seen[threshold] = lost[0].data["at"] - heard
        assert lost[0].text.startswith("worker1 lost: its agent has sent nothing for 5 s")
        ranks = {r.rank: r for r in watcher.snapshot().ranks}
        assert ranks[2].state == ranks[3].state == "unknown", ranks
        # Nothing is judged from worker1's old data: no straggler "computing" there, no deadlock.
        assert not [e for e in events if e.kind in ("straggler", "diagnosis", "incident")], [e.text for e in events]
    assert seen[8.0] == seen[20.0] and 5.0 <= seen[8.0] <= 5.5, seen
    header, watcher, events = replay("leave", tmp_path / "named", lost=silent)
    unseen = [e for e in events if e.snapshot is not None and e.snapshot.diagnosis is not None]
    assert unseen and unseen[0].snapshot.diagnosis.kind == "unseen", [e.text for e in events]
    assert unseen[0].text.startswith("ranks 0,1 wait in all_reduce; ranks 2,3 unknown (not watched: worker1's "
                                     "agent went silent)")


def test_a_node_that_reports_again_is_watched_again_and_its_deadlock_still_named(tmp_path):
    header, watcher, events = replay("leave", tmp_path, lost=lambda r: r["node"] == "worker1" and 6.0 < r["at"] < 12.0)
    lost, back = _worker1_lost(events), [e for e in events if e.kind == "node" and "watched again" in e.text]
    assert len(lost) == 1 and len(back) == 1 and lost[0].data["at"] < back[0].data["at"], [e.text for e in events]
    assert back[0].data["status"] == "watching" and back[0].text.startswith("worker1 watched again")
    diagnosis = next(e for e in events if e.kind == "diagnosis").snapshot.diagnosis
    assert diagnosis.kind == "deadlock" and diagnosis.culprits == [3], diagnosis


def test_the_trace_has_one_line_per_input_and_never_follows_a_link(tmp_path, monkeypatch):
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("HANGWATCH_TRACE", str(trace))
    now = [10.0]
    watcher = Watcher([WatchTarget(LocalNode("master", "python"))], clock=lambda: now[0],
                      wall=lambda: 1_800_000_000.0 + now[0], incident_dir=str(tmp_path / "incidents"))
    watcher.receive("master", {"type": "hello", "pid": 1, "py_spy": "/usr/bin/py-spy", "time": 1_800_000_009.5})
    watcher.receive("master", {"type": "sample", "t": 1_800_000_009.75, "ranks": []})
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [(x["input"], x["node"], x["message"], x["t"]) for x in lines] == [
        ("FromAgent", "master", "Hello", None), ("FromAgent", "master", "Sample", 1_800_000_009.75)]
    assert lines[1]["wall"] == 1_800_000_010.0 and oct(trace.stat().st_mode & 0o777) == "0o600"
    # A link in its place (another user's, planted where root's trace goes): not followed.
    target = tmp_path / "target"
    target.write_text("kept\n")
    linked = tmp_path / "linked.jsonl"
    linked.symlink_to(target)
    monkeypatch.setenv("HANGWATCH_TRACE", str(linked))
    watcher = Watcher([WatchTarget(LocalNode("master", "python"))], clock=lambda: now[0],
                      wall=lambda: 1_800_000_000.0 + now[0], incident_dir=str(tmp_path / "incidents"))
    watcher.receive("master", {"type": "hello", "pid": 1, "py_spy": "/usr/bin/py-spy"})
    assert watcher.trace is None and target.read_text() == "kept\n"
