"""No false alarm (issue 35): a wait that may end by itself is never a certain hang, and only a
certain hang stops a run. Replays of what real agents sent (tests/unit/artifacts/agent) through
the real Watcher on a driven clock; each asserts the exact verdict, certainty and culprits."""

from __future__ import annotations

import json

from ddp_preflight.hangwatch import stall
from ddp_preflight.hangwatch.text import summary

from .test_hangwatch_watch import AGENT, replay


def _verdicts(events):
    return [e for e in events if e.verdict is not None]


def test_a_rank_asleep_in_its_loop_is_held_likely_with_its_line_and_never_a_hang_before_its_bound(tmp_path):
    # sleep.jsonl: rank 2 sleeps (600 s) inside its loop from 10.35 s; the others wait in DDP's
    # all_reduce. Its sleep may end by itself (a checkpoint, an evaluation): likely, no hang, no bundle.
    header, watcher, events = replay("sleep", tmp_path)
    said = _verdicts(events)
    assert [e.kind for e in said] == ["notice"], [(e.kind, e.text) for e in events]
    d = said[0].verdict
    assert (d.kind, d.culprits, d.candidates, d.reason, d.certainty, d.bound) == \
        ("held", [2], [], "sleeps", "likely", stall.HELD_BOUND)
    assert summary(d).startswith("rank 2 sleeps outside any collective: idle at hang_train.py:199 (main); "
                                 "ranks 0,1,3 wait in all_reduce; likely a stall ("), summary(d)
    assert summary(d).endswith("which may end by itself; a hang if it lasts 300 s"), summary(d)
    assert not d.kind.is_hang
    assert not [e for e in events if e.kind in ("diagnosis", "incident")]
    assert said[0].data["at"] - header["fault_at"] <= stall.DEFAULT_THRESHOLD + 2


def test_past_its_bound_the_sleeper_is_a_certain_deadlock_and_stops_the_run(tmp_path):
    hangs: list[tuple[str, bool]] = []
    header, watcher, events = replay("sleep", tmp_path, held_after=20.0, on_hang=lambda b, c: hangs.append((b, c)))
    said = _verdicts(events)
    assert [(e.kind, e.verdict.kind, e.verdict.certainty) for e in said] == \
        [("notice", "held", "likely"), ("diagnosis", "deadlock", "certain")], [e.text for e in said]
    held, hang = said
    assert hang.verdict.culprits == [2] and hang.verdict.reason == "sleeps"
    # 20 s after progress stopped: the others' last all_reduce, within a sample before the fault
    assert 19.0 <= hang.data["at"] - header["fault_at"] <= 20.0 + stall.RECHECK
    assert [c for _, c in hangs] == [True]          # --stop-on-hang acts on it


def test_a_likely_hang_writes_its_bundle_and_never_stops_the_run(tmp_path):
    # subgroup.jsonl: rank 1 skipped the subgroup's all_reduce: a mismatch said as likely (a member
    # that called one more looks the same). Its bundle is written; --stop-on-hang does not act.
    hangs: list[tuple[str, bool]] = []
    header, watcher, events = replay("subgroup", tmp_path, on_hang=lambda b, c: hangs.append((b, c)))
    said = [e for e in events if e.kind == "diagnosis"]
    assert [(e.verdict.kind, e.verdict.culprits, e.verdict.certainty) for e in said] == [("mismatch", [1], "likely")]
    assert [c for _, c in hangs] == [False]


def test_a_rank_that_left_its_loop_is_still_certain_and_stops_the_run(tmp_path):
    hangs: list[tuple[str, bool]] = []
    header, watcher, events = replay("leave", tmp_path, on_hang=lambda b, c: hangs.append((b, c)))
    said = [e for e in events if e.kind == "diagnosis"]
    assert [(e.verdict.kind, e.verdict.culprits, e.verdict.reason, e.verdict.certainty) for e in said] == \
        [("deadlock", [header["rank"]], "left-loop", "certain")]
    assert [c for _, c in hangs] == [True]


def _with_wire(tmp_path, name: str, carried) -> None:
    """NAME.jsonl again in tmp_path, each rank's samples given `wire` (bytes its connections carried
    so far, node/wire.py): carried(at) for every rank. Everything else as recorded."""
    lines = (AGENT / f"{name}.jsonl").read_text().splitlines()
    out = [lines[0]]
    for line in lines[1:]:
        record = json.loads(line)
        if record["msg"].get("type") == "sample":
            for r in record["msg"]["ranks"]:
                r["wire"] = carried(record["at"])
        out.append(json.dumps(record))
    (tmp_path / f"{name}.jsonl").write_text("\n".join(out) + "\n")


def test_ranks_whose_connections_carry_bytes_each_step_make_progress_at_no_cpu(tmp_path):
    # DERIVED from sleep.jsonl (rank 2 asleep from 10.35 s, the others waiting at ~0% CPU): as a
    # straggler that sleeps 4 s a step would show it, every rank's connections carry one step's
    # all_reduce every 4 s. That is progress: no quiet time reaches the threshold, no verdict, no
    # stacks asked after the fault (before, progress was CPU >= 5% alone: "DEADLOCK ... sleeps").
    _with_wire(tmp_path, "sleep", lambda at: 4096 * int(at // 4))
    header, watcher, events = replay("sleep", tmp_path, folder=tmp_path)
    assert not _verdicts(events), [(e.kind, e.text) for e in events]
    assert all(t.idle_for < stall.DEFAULT_THRESHOLD for t in watcher.snapshot().ranks)


def test_bytes_that_stop_with_the_fault_leave_the_stall_as_it_was(tmp_path):
    # The same derivation, the bytes stopping at the fault (a peer that never sends): the sleeper
    # is held, as from the recording itself; the quiet time starts at the last bytes.
    _with_wire(tmp_path, "sleep", lambda at: 4096 * int(min(at, 10.354) // 1))
    header, watcher, events = replay("sleep", tmp_path, folder=tmp_path)
    said = _verdicts(events)
    assert [(e.kind, e.verdict.kind, e.verdict.culprits, e.verdict.certainty) for e in said] == \
        [("notice", "held", [2], "likely")], [e.text for e in events]


def _asleep_in_its_loop(tmp_path, name: str, pid: int, after: float) -> None:
    """NAME.jsonl again in tmp_path, rank `pid` seen as the agent now sees a sleeper (recorded before
    the agent read system calls and loops): from `after` on its samples say it waits in a sleep
    (node/blocked.py) and its own frames sit inside a loop (node/loops.py)."""
    lines = (AGENT / f"{name}.jsonl").read_text().splitlines()
    out = [lines[0]]
    for line in lines[1:]:
        record = json.loads(line)
        msg = record["msg"]
        if msg.get("type") == "sample" and record["at"] >= after:
            for r in msg["ranks"]:
                if r["pid"] == pid:
                    r["waits_in"] = {"call": "sleep"}
        if msg.get("type") == "stacks":
            for thread in (msg.get("stacks") or {}).get(str(pid)) or []:
                for frame in thread["frames"]:
                    if frame.get("short_filename") == "hang_train.py":
                        frame["in_loop"] = True
        out.append(json.dumps(record))
    (tmp_path / f"{name}.jsonl").write_text("\n".join(out) + "\n")


def test_a_sleeper_whose_peers_time_out_is_the_hang_once_their_timeout_passed(tmp_path):
    # DERIVED from cascade.jsonl: init_process_group(timeout=20 s); rank 0 (pid 12476) sleeps 90 s in
    # its loop from 40.5 s. Held (likely) while the others wait; their timeout is the bound: when
    # they end ("Timed out"), rank 0 asleep is the hang, certain, and their ends its consequence.
    header = json.loads((AGENT / "cascade.jsonl").read_text().splitlines()[0])
    _asleep_in_its_loop(tmp_path, "cascade", 12476, header["fault_at"])
    hangs: list[bool] = []
    header, watcher, events = replay("cascade", tmp_path, folder=tmp_path, on_hang=lambda b, c: hangs.append(c))
    # (Between them, as rank 1's all_reduce times out, it uses CPU raising while 2,3 still wait: a
    # straggler notice, which is what was seen; no hang.)
    said = [e for e in _verdicts(events) if e.verdict.kind != "straggler"]
    assert [(e.kind, e.verdict.kind, e.verdict.culprits, e.verdict.reason, e.verdict.certainty) for e in said] == \
        [("notice", "held", [0], "sleeps", "likely"), ("diagnosis", "deadlock", [0], "sleeps", "certain")], \
        [e.text for e in said]
    assert said[1].verdict.since == said[0].verdict.since      # the stall began when progress stopped
    assert summary(said[1].verdict).startswith("rank 0 sleeps outside any collective: idle at hang_train.py:197 "
                                               "(main); ranks 1,2,3 wait in all_reduce"), summary(said[1].verdict)
    assert [e.kind for e in events].count("incident") == 1 and hangs == [True]
    assert (watcher.state.diagnosis.kind, watcher.state.diagnosis.culprits) == ("deadlock", [0])


def test_step_lines_the_launcher_reads_are_progress_at_no_cpu(tmp_path):
    # sleep.jsonl as recorded (no bytes counted), under --launch: the launcher reads each rank's
    # new step line every 4 s (a straggler's run, every rank waiting most of each step). Progress:
    # no verdict. The same lines stopping at the fault leave the sleeper held, as recorded.
    header = json.loads((AGENT / "sleep.jsonl").read_text().splitlines()[0])
    nodes = {0: "master", 1: "master", 2: "worker1", 3: "worker1"}

    def steps(until):
        return [(at, lambda w, at=at, r=r: w.rank_stepped(nodes[r], r, int(at)))
                for at in range(4, 40, 4) if at < until for r in nodes]
    header, watcher, events = replay("sleep", tmp_path / "steps", then=steps(40))
    assert not _verdicts(events), [(e.kind, e.text) for e in events]
    header, watcher, events = replay("sleep", tmp_path / "stopped", then=steps(header["fault_at"]))
    assert [(e.kind, e.verdict.kind, e.verdict.culprits) for e in _verdicts(events)] == [("notice", "held", [2])]


def test_peers_that_end_by_an_error_of_their_own_do_not_make_the_sleeper_certain(tmp_path):
    # The same derivation, every end's own record saying another error than a timeout (a bad batch):
    # their wait did not reach its bound, so the sleeper is never named certain for it.
    header = json.loads((AGENT / "cascade.jsonl").read_text().splitlines()[0])
    _asleep_in_its_loop(tmp_path, "cascade", 12476, header["fault_at"])
    path = tmp_path / "cascade.jsonl"
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines[1:], 1):
        record = json.loads(line)
        if record["msg"].get("type") == "exit" and isinstance(record["msg"].get("ending"), dict):
            record["msg"]["ending"]["message"] = "bad batch at step 5"
            lines[i] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")
    header, watcher, events = replay("cascade", tmp_path, folder=tmp_path)
    said = [(e.verdict.kind, e.verdict.culprits, e.verdict.certainty) for e in _verdicts(events)]
    assert ("deadlock", [0], "certain") not in said and said[0] == ("held", [0], "likely"), said


def _flight(seq: int, completed: int | None) -> dict:
    """A Flight Recorder summary as the agent sends it (subgroup.jsonl's, at 34.4 s), its default
    group's numbers set."""
    return {"groups": [{"group": "default_pg", "id": "0", "seq": seq, "op": "all_reduce", "state": "scheduled",
                        "completed": completed, "last": False},
                       {"group": "undefined", "id": "1", "seq": 6, "op": "all_reduce", "state": "scheduled",
                        "completed": None, "last": True}], "entries": 16}


def test_flight_recorder_numbers_that_move_between_two_reads_in_a_quiet_time_are_progress():
    from ddp_preflight.hangwatch.model import RankView
    from ddp_preflight.hangwatch.progress import flight_read
    from ddp_preflight.hangwatch.state import Track

    def track(read_at: float) -> Track:
        t = Track(RankView("master", 7096, rank=0), idle_since=10.0)
        flight_read(t, _flight(10, None), read_at)
        t.idle_since = 10.0
        return t
    moved = track(12.0)
    flight_read(moved, _flight(11, 10), 16.0)        # a collective issued (and one completed) since 12 s
    assert (moved.idle_since, moved.progress_at) == (None, 16.0)
    same = track(12.0)
    flight_read(same, _flight(10, None), 16.0)       # nothing moved: still quiet since 10 s
    assert (same.idle_since, same.progress_at) == (10.0, None)
    early = track(8.0)
    flight_read(early, _flight(11, 10), 16.0)        # moved, but maybe before its quiet time began
    assert (early.idle_since, early.progress_at) == (10.0, None)


def test_a_rank_busy_at_no_known_line_is_never_said_to_compute_for_ever():
    # The third soak (bench/results/soak-issue35-run3.txt): during rank 0's 60 s checkpoint, rank 3
    # busy at no line its stack showed was "ENDLESS: ... computed for 61 s at an unknown line".
    from ddp_preflight.hangwatch.model import Evidence, RankStatus
    from ddp_preflight.hangwatch.stalled import Stall
    from ddp_preflight.hangwatch.waiting import straggler
    waiting = Evidence("worker1", 11, 2, RankStatus.COLLECTIVE, op="barrier", frame="soak_train.py:150")
    unseen = Evidence("worker1", 12, 3, RankStatus.RUNNING)
    seen_line = Evidence("worker1", 12, 3, RankStatus.RUNNING, frame="soak_train.py:60", function="busy")
    for busy, kind in ((unseen, "straggler"), (seen_line, "endless")):
        found = straggler(Stall({2: waiting, 3: busy}, waited=61.0, endless=40.0))
        assert found is not None and (found.kind, tuple(found.culprits)) == (kind, (3,))
