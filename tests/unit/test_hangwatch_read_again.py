"""Asks back to back must not hold the ranks they read for good. py-spy suspends a rank while it
reads it; on CI's loaded box a native read took seconds (straggle's held samples, 21-35 s: see
test_hangwatch_held.py). A stall's stacks are asked again once they are older than RECHECK: with
each read taking that long, the next ask came as the last answer did, and the master's two ranks,
waiting in all_reduce behind rank 2 asleep, had no sample of their own for 28 s. Their CPU stayed
the last they had used, so CI's verdict was "not a hang: rank 3 waits in all_reduce while rank 0
is computing, rank 1 is computing", and no deadlock.

DERIVED from sleep.jsonl (rank 2 sleeps from 10.35 s, the others wait in DDP's all_reduce): the
worker's messages as recorded; the master answers each ask with its recorded two parts, the
native one DUMP s later, and every master sample while a read runs is held (0% CPU, as a held
rank reads). Before the fault the master's ranks are busy, as they were."""

from __future__ import annotations

import copy
import json

from ddp_preflight.hangwatch import stall

from .test_hangwatch_watch import AGENT, LocalNode, Watcher, WatchTarget

DUMP = 10.0         # seconds one native read of the master's ranks takes: py-spy's bound (node/pyspy.py), passed
END = 40.0


# A sleeper's wait may end by itself: it is a hang only past its bound (stall.HELD_BOUND, issue 35).
# What these tests look at is when stacks are read, so the bound is the threshold.
SLEEPER_BOUND = stall.DEFAULT_THRESHOLD

def _records():
    lines = (AGENT / "sleep.jsonl").read_text().splitlines()
    return json.loads(lines[0]), [json.loads(line) for line in lines[1:]]


def _drive(tmp_path):
    """The watcher's events, its asks' times, and the header."""
    header, records = _records()
    def answer(node):
        parts = [r["msg"] for r in records if r["node"] == node and r["msg"]["type"] == "stacks" and r["msg"].get("id")]
        assert parts[0].get("partial") and not parts[1].get("partial")
        return parts[0], parts[1]
    partial, native = answer("master")
    worker_partial, worker_native = answer("worker1")
    recorded_sample = next(r["msg"] for r in records if r["node"] == "master" and r["msg"]["type"] == "sample"
                         and r["at"] > header["fault_at"] + 2)
    hello = next(r for r in records if r["msg"].get("type") == "hello")
    began = hello["msg"]["time"] - hello["at"]
    now = [0.0]
    events: list = []
    watcher = Watcher([WatchTarget(LocalNode("master", "python")), WatchTarget(LocalNode("worker1", "python"))],
                      clock=lambda: now[0], wall=lambda: began + now[0], threshold=stall.DEFAULT_THRESHOLD,
                      on_event=events.append, incident_dir=str(tmp_path / "incidents"),
                      held_after=SLEEPER_BOUND)
    # The recording up to its first ask, then: the worker's samples as recorded, and each ask answered
    # by both agents with their recorded answers: the worker's parts 1 s apart, the master's DUMP s.
    first_ask = min(r["at"] for r in records if r["msg"]["type"] == "stacks" and r["msg"].get("id"))
    script = [r for r in records if r["at"] < first_ask or (r["node"] == "worker1" and r["msg"]["type"] == "sample")]
    script = [r for r in script if r["at"] < END]
    reads: list[tuple[float, float]] = []          # (from, to): the master's ranks held
    asked: list[float] = []
    pending: list[tuple[float, str, dict]] = []     # (at, node, message) the agents send
    seen_ask = None

    def master_answers(at):
        nonlocal seen_ask
        ask = max(watcher.state.asks, default=None)
        if ask is None or ask == seen_ask or "master" not in watcher.state.asked:
            return
        seen_ask = ask
        asked.append(at)
        pending.append((at + 0.1, "master", {**copy.deepcopy(partial), "id": ask, "t": began + at + 0.1}))
        # py-spy's bound passed: the agent sends the Python frames it has (node/agent.py, native_of).
        late = {**copy.deepcopy(partial), "id": ask, "t": began + at + DUMP, "partial": []}
        pending.append((at + DUMP, "master", late))
        pending.append((at + 0.1, "worker1", {**copy.deepcopy(worker_partial), "id": ask, "t": began + at + 0.1}))
        pending.append((at + 1.0, "worker1", {**copy.deepcopy(worker_native), "id": ask, "t": began + at + 1.0}))
        reads.append((at, at + DUMP))

    def master_sample(at):
        msg = copy.deepcopy(recorded_sample)
        msg["t"] = began + at
        held = any(a < at and b > at - 1.0 for a, b in reads)       # a read ran in this sample's second
        for rank in msg["ranks"]:
            rank["cpu"] = 0.0 if (held or asked) else 50.0     # busy as last read until the first ask
            rank["state"] = "S"
            if held:
                rank["held"] = True
        return msg

    step = 0.25
    i = 0
    next_sample = first_ask + 0.5
    while now[0] < END:
        now[0] = round(now[0] + step, 3)
        while i < len(script) and script[i]["at"] <= now[0]:
            r = script[i]
            if not (r["node"] == "master" and r["msg"]["type"] == "sample" and r["at"] > header["fault_at"] - 1):
                watcher.receive(r["node"], r["msg"])
            else:
                msg = copy.deepcopy(r["msg"])
                for rank in msg["ranks"]:
                    rank["cpu"] = 50.0            # the master's ranks, busy up to the fault as the loaded box read them
                watcher.receive(r["node"], msg)
            i += 1
        for due in [p for p in pending if p[0] <= now[0]]:
            watcher.receive(due[1], due[2])
            pending.remove(due)
        if now[0] >= next_sample:
            watcher.receive("master", master_sample(now[0]))
            next_sample += 1.0
        watcher.tick()
        for e in events:
            e.data.setdefault("at", now[0])
        master_answers(now[0])
    return header, events, asked


def test_asks_wait_for_a_sample_of_their_own_and_the_sleeper_is_named(tmp_path):
    header, events, asked = _drive(tmp_path)
    said = [e for e in events if e.kind == "diagnosis"]
    assert said, [e.text for e in events]
    d = said[0].snapshot.diagnosis
    assert (d.kind, d.culprits, d.candidates, d.reason, d.certainty) == ("deadlock", [2], [], "sleeps", "certain")
    # Within what the lab test allows (the threshold and 20 s from the fault), reads that long notwithstanding.
    assert said[0].data["at"] - header["fault_at"] <= stall.DEFAULT_THRESHOLD + 20, said[0].data["at"]
    # Never an ask while the last one's read held the master's ranks: each came after a free sample.
    assert all(later - earlier >= DUMP + 1.0 for earlier, later in zip(asked, asked[1:], strict=False)), asked
    assert not any(e.kind == "straggler" for e in events), [e.text for e in events if e.kind == "straggler"]
