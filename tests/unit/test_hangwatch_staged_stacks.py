"""Stacks asked for in a stall come in two parts (node/agent.py): every rank's Python frames at
once, then the native frames of those whose Python frames do not stop in torch.distributed. On a
loaded 2-core box the native part came 8-12 s after the ask (libtorch's symbols), and a verdict
that waited for it came 15 s after its fault (CI). The watcher decides from the Python frames
wherever they decide, and waits for the native ones where they could say otherwise.

Replayed on agent messages recorded from lab runs (record.py): sleep.jsonl, rank 2 asleep inside
its loop while the others wait in DDP's all_reduce under backward(); work.jsonl, rank 3 leaves the
loop while the others wait in Work.wait() under a line of the script's own (seen in native frames
only). Each native part is replayed LATE seconds after it came, as on the loaded box."""

from __future__ import annotations

import json

from ddp_preflight.hangwatch.text import summary
from ddp_preflight.hangwatch.verdicts import NATIVE_WAIT

from .test_hangwatch_watch import AGENT, replay

LATE = 10.0
# A sleeper's wait may end by itself: it is a hang only past its bound (stall.HELD_BOUND, issue 35).
# What these tests look at is the stacks' two parts, so the bound is the threshold.
SLEEPER_BOUND = 8.0


def _records(name: str) -> list[dict]:
    return [json.loads(line) for line in (AGENT / f"{name}.jsonl").read_text().splitlines()]


def _native_late(name: str) -> tuple[dict, float]:
    """replay()'s lost= and then= that bring every asked stacks message that follows a partial one
    (the native part) LATE s after it came; and when the first of them came as recorded."""
    records = _records(name)[1:]
    late = [r for r in records if r["msg"]["type"] == "stacks" and r["msg"].get("id") and not r["msg"].get("partial")
            and any(p["msg"]["type"] == "stacks" and p["msg"].get("id") == r["msg"]["id"] and p["msg"].get("partial")
                    and p["node"] == r["node"] for p in records)]
    keys = {(r["at"], r["node"]) for r in late}
    return ({"lost": lambda record: (record["at"], record["node"]) in keys,
             "then": [(r["at"] + LATE, lambda w, r=r: w.receive(r["node"], r["msg"])) for r in late]},
            min(r["at"] for r in late))


def _first_diagnosis(events):
    return next(e for e in events if e.kind == "diagnosis")


def test_python_frames_that_decide_name_the_hang_before_the_native_ones_come(tmp_path):
    header = _records("sleep")[0]
    options, native_at = _native_late("sleep")
    header_, watcher, events = replay("sleep", tmp_path, held_after=SLEEPER_BOUND, **options)
    said = _first_diagnosis(events)
    d = said.snapshot.diagnosis
    assert (d.kind, d.culprits, d.candidates, d.reason, d.certainty) == ("deadlock", [2], [], "sleeps", "certain")
    assert summary(d) == ("rank 2 sleeps outside any collective: idle at hang_train.py:199 (main); "
                          "ranks 0,1,3 wait in all_reduce")
    # Within the threshold of the fault, and before any native part came (LATE s after its own time).
    assert said.data["at"] - header["fault_at"] <= 8.0 + 1.0, (said.data["at"], header)
    assert said.data["at"] < native_at + LATE


def test_python_frames_that_could_mislead_wait_for_the_native_ones(tmp_path):
    # Ranks 0,1,2 idle at a line of their own (self._work.wait()): from Python frames alone they
    # would look as if they had left the loop too. The verdict waits for their native frames.
    options, native_at = _native_late("work")
    header, watcher, events = replay("work", tmp_path, **options)
    said = _first_diagnosis(events)
    d = said.snapshot.diagnosis
    assert (d.kind, d.culprits, d.candidates, d.reason) == ("deadlock", [3], [], "left-loop")
    assert summary(d).endswith("ranks 0,1,2 wait in Work.wait()"), summary(d)
    assert said.data["at"] >= native_at + LATE


def test_a_lock_its_own_line_acquires_is_decided_before_the_native_frames_come(tmp_path):
    # lock.jsonl: rank 0 blocks in a bare `lock.acquire()` (C code: no Python frame under its line)
    # while the others wait in DDP's all_reduce. Its line's code (read on the node: it acquires a
    # lock) and the kernel (its main thread waits on a futex) say where it waits; the native frames
    # would only name the same wait. CI's full run had this verdict at 14.5 s, waiting for them.
    header = _records("lock")[0]
    options, native_at = _native_late("lock")
    header_, watcher, events = replay("lock", tmp_path, **options)
    said = _first_diagnosis(events)
    d = said.snapshot.diagnosis
    assert (d.kind, d.culprits, d.candidates, d.reason, d.certainty) == \
        ("deadlock", [0], [], "waits-on-lock", "certain") and header["rank"] == 0
    assert summary(d) == ("rank 0 waits on a lock outside any collective: idle at hang_train.py:218 (main); "
                          "ranks 1,2,3 wait in all_reduce")
    assert said.data["at"] - header["fault_at"] <= 8.0 + 1.0, (said.data["at"], header)
    assert said.data["at"] < native_at + LATE
    rank0 = next(e for e in d.evidence if e.rank == 0)
    assert "waits in a lock its line acquires (hang_train.py:218)" in rank0.notes, rank0.notes


def test_a_line_that_acquires_is_no_lock_wait_unless_the_kernel_has_it_waiting_on_one(tmp_path):
    # The same Python frames, the main thread's system call not a futex (derived: a recv): the
    # line's code alone decides nothing; the native frames are waited for.
    from ddp_preflight.hangwatch.classify import classify
    stacks = next(r["msg"] for r in _records("lock")[1:] if r["msg"]["type"] == "stacks" and r["msg"].get("partial")
                  and r["node"] == "master")
    pid = next(p for p, dump in stacks["stacks"].items()
               if any(f.get("waits_on") == "lock" for t in dump for f in t["frames"]))
    dump = stacks["stacks"][pid]
    assert classify(dump, 0.0, waits_in={"call": "lock"}).reason == "waits-on-lock"
    assert classify(dump, 0.0, waits_in={"call": "recv", "on": "socket"}).reason == "waits-to-receive"
    # Nothing read of its wait, at a line inside its loop: it has not left the loop (issue 35: that
    # was said, certain, of a healthy straggler whose system call went unread in one sample).
    assert classify(dump, 0.0, waits_in=None).reason == "idle-in-loop"


def _bundle(events) -> tuple[float, str]:
    """When the incident bundle was said written, and its report."""
    written = next(e for e in events if e.kind == "incident")
    with open(f"{written.data['path']}/report.txt") as f:
        return written.data["at"], f.read()


def test_a_hang_named_before_the_native_frames_come_has_them_in_its_bundle(tmp_path):
    # CI: the verdict came from the Python frames, the bundle was written at once, and the native
    # frames that came a second later (DDP's reducer under backward()) were in no report.
    options, native_at = _native_late("sleep")
    header, watcher, events = replay("sleep", tmp_path, held_after=SLEEPER_BOUND, **options)
    said = _first_diagnosis(events)
    at, report = _bundle(events)
    assert said.data["at"] < native_at + LATE <= at
    assert "c10d::Reducer::finalize_backward" in report
    assert report.startswith("hangwatch incident") and "DEADLOCK: rank 2 sleeps outside any collective" in report
    assert [e.kind for e in events].count("incident") == 1


def test_native_frames_that_never_come_hold_the_bundle_no_longer_than_its_bound(tmp_path):
    options, native_at = _native_late("sleep")
    header, watcher, events = replay("sleep", tmp_path, held_after=SLEEPER_BOUND, lost=options["lost"])
    said = _first_diagnosis(events)
    at, report = _bundle(events)
    assert NATIVE_WAIT <= at - said.data["at"] <= NATIVE_WAIT + 0.5
    assert "c10d::Reducer::finalize_backward" not in report and "DEADLOCK: rank 2 sleeps" in report


def test_a_watch_that_ends_before_the_native_frames_come_still_writes_the_bundle(tmp_path):
    options, native_at = _native_late("sleep")
    header, watcher, events = replay("sleep", tmp_path, held_after=SLEEPER_BOUND, lost=options["lost"],
                                    until=native_at + 5)
    _first_diagnosis(events)                 # named
    assert not [e for e in events if e.kind == "incident"]
    watcher.close()
    (written,) = [e for e in events if e.kind == "incident"]
    with open(f"{written.data['path']}/report.txt") as f:
        assert "DEADLOCK: rank 2 sleeps" in f.read()


def test_an_answer_to_an_ask_made_before_the_stall_that_comes_late_says_nothing_of_now(tmp_path):
    # CI, on a loaded 2-core box: an agent answered its asks seconds late and one after another, so
    # the answer to an ask made while the ranks still trained came after the ask made in the stall.
    # It was taken as that newer ask's answer: stacks of a step already done replaced the ranks'
    # wait, and the verdict came 19 s after the fault (threshold 8). recv.jsonl: every rank
    # receives from the next, nobody sends. The user asks for stacks (the dashboard's d) at 5 s,
    # while they train; that ask's answer (recorded at 2.9 s, ranks computing) comes at 14.3 s,
    # after the stall's own ask was answered.
    records = _records("recv")
    training = next(r["msg"] for r in records[1:] if r["msg"]["type"] == "stacks" and r["node"] == "master")
    asked = {}

    def ask(w):
        w.dump_stacks()
        asked["id"] = max(w.state.asks)

    _, _, clean = replay("recv", tmp_path / "clean")
    header, watcher, events = replay("recv", tmp_path / "late", then=[
        (5.0, ask), (14.3, lambda w: w.receive("master", {**training, "id": asked["id"]}))])
    expected, said = _first_diagnosis(clean), _first_diagnosis(events)
    d = said.snapshot.diagnosis
    assert (d.kind, d.culprits, d.candidates, d.reason, d.certainty) == \
        ("deadlock", [], [0, 1, 2, 3], "wait-for-each-other", "unsure")
    assert said.data["at"] == expected.data["at"] and summary(d) == summary(expected.snapshot.diagnosis)


def test_a_straggler_whose_native_frames_come_late_is_named_at_the_line_it_computes_now(tmp_path):
    # straggle-staged.jsonl: rank 0 computes for 30 s at step 5 (compute(), hang_train.py:82) while
    # the others wait in all_reduce. Its only stack before then was the agent's own at start-up
    # (importing torch, hang_train.py:52); the stall's ask brings its Python frames at once and its
    # native ones LATE s later. On CI's box the straggler was said from the start-up stack ("rank 0
    # is importing torch at hang_train.py:52"). Busy at a line of its own on a node with no GPU, and
    # busy over the next whole sample, its Python frames decide: it computes there (a rank that
    # blocks under its line goes quiet instead: lab test [lock]). And the native part of the stall's second ask, come
    # LATE s later after every rank resumed, shows ranks 1,2,3 at the wait the first ask showed:
    # they were quiet in between, never spinning there, and no second straggler is said.
    header = _records("straggle-staged")[0]
    options, native_at = _native_late("straggle-staged")
    header_, watcher, events = replay("straggle-staged", tmp_path, **options)
    said = [e for e in events if e.kind in ("straggler", "diagnosis")]
    assert [e.kind for e in said] == ["straggler"], [e.text for e in said]
    assert said[0].text == ("not a hang: ranks 1,2,3 wait in all_reduce while rank 0 is computing at hang_train.py:82 "
                            "(compute); the waiting ranks were idle 47% of the last 15 s"), said[0].text
    assert said[0].data["at"] < native_at + LATE and header["rank"] == 0


def test_a_working_rank_whose_newer_stack_is_on_its_way_is_not_placed_by_its_older_one(tmp_path):
    # The same replay, master taken for a node whose agent reads GPUs: there busy Python frames at a
    # line of its own do not decide (a host thread spinning on its GPU looks the same), and until
    # rank 0's native frames come the stack in hand (start-up's, importing torch) no longer says
    # where it is. It is working, no line.
    options, native_at = _native_late("straggle-staged")
    options["then"] = [(0.0, lambda w: w.state.gpu_nodes.add("master")), *options["then"]]
    header, watcher, events = replay("straggle-staged", tmp_path, until=native_at + LATE - 0.5, **options)
    said = [e for e in events if e.kind in ("straggler", "diagnosis")]
    assert [e.kind for e in said] == ["straggler"], [e.text for e in said]
    assert said[0].text == ("not a hang: ranks 1,2,3 wait in all_reduce while rank 0 is computing; the waiting ranks "
                            "were idle 47% of the last 15 s"), said[0].text
