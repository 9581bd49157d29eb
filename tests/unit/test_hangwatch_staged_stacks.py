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

from hangwatch.text import summary

from .test_hangwatch_watch import AGENT, replay

LATE = 10.0


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
    header_, watcher, events = replay("sleep", tmp_path, **options)
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
