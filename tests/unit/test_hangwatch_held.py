"""A rank our own py-spy holds is not a rank that stopped. py-spy suspends a rank while it reads
its stack: native frames take seconds on a loaded node, and a stall's stacks are asked again. In
CI a rank computing for 30 s (the straggler) read 0% CPU for the samples its dumps held it, and
was named DEADLOCK "left the loop: idle at hang_train.py:82 (compute)": a wrong culprit. The agent
now says which samples its py-spy held a rank in (`held`); such a sample starts no quiet time.

DERIVED from straggle.jsonl (rank 0 computes from 15.5 s while the others wait): rank 0's samples
from 21 s to 35 s read 0% CPU, as the repeated dumps left them, with and without `held`."""

from __future__ import annotations

import copy
import json

from .test_hangwatch_watch import AGENT, replay

HELD_FROM, HELD_TO = 21.0, 35.0


def _held_recording(tmp_path, held: bool) -> str:
    lines = (AGENT / "straggle.jsonl").read_text().splitlines()
    out = [lines[0]]
    for line in lines[1:]:
        record = json.loads(line)
        msg = record["msg"]
        if msg["type"] == "sample" and record["node"] == "master" and HELD_FROM <= record["at"] <= HELD_TO:
            msg = copy.deepcopy(msg)
            for rank in msg["ranks"]:
                if rank.get("rank") == 0:
                    rank["cpu"] = 0.0
                    if held:
                        rank["held"] = True
            record = {**record, "msg": msg}
        out.append(json.dumps(record))
    name = f"straggle-held-{held}"
    (tmp_path / f"{name}.jsonl").write_text("\n".join(out) + "\n")
    return name


def _replayed(tmp_path, held: bool):
    return replay(_held_recording(tmp_path, held), tmp_path, folder=tmp_path)


def test_samples_our_py_spy_held_are_no_quiet_time_and_the_straggler_stays_one(tmp_path):
    header, watcher, events = _replayed(tmp_path, held=True)
    kinds = [e.kind for e in events]
    assert "diagnosis" not in kinds and "incident" not in kinds, [e.text for e in events]
    straggler = next(e for e in events if e.kind == "straggler")
    assert straggler.snapshot.diagnosis.culprits == [0]


def test_the_same_samples_unmarked_name_the_computing_rank_a_deadlock(tmp_path):
    # What CI saw: without the agent's word, 0% CPU is a rank that stopped.
    header, watcher, events = _replayed(tmp_path, held=False)
    found = next(e for e in events if e.kind == "diagnosis")
    d = found.snapshot.diagnosis
    # (ranks 2 and 3 as this derived recording leaves them; the point is rank 0, computing, named)
    assert (d.kind, d.culprits, d.reason) == ("deadlock", [0, 2, 3], "left-loop")
