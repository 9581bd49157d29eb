"""A rank stopped by SIGSTOP is decided by the kernel's state and its Python frames: its native
frames never hold the verdict. On CI's loaded box the agent read them for 7 s after the Python
frames came (the stall's answer in two parts), and the deadlock was said 10.03 s after the fault,
past the threshold's bound, only once they came.

DERIVED from stop.jsonl (rank 1, pid 1469 on the master, stopped at 8.78 s; the others wait in
all_reduce): the master's answer to the stall's first ask is sent as the agent sends it when a
rank's Python frames do not stop in torch.distributed: the Python frames at once, marked partial
for the stopped rank, and the native ones NATIVE_LATE s later (here the same frames: the recording
read them in one go)."""

from __future__ import annotations

import json

from ddp_preflight.hangwatch import stall
from ddp_preflight.hangwatch.text import summary

from .test_hangwatch_watch import AGENT, replay

NATIVE_LATE = 10.0


def _derive(folder):
    lines = (AGENT / "stop.jsonl").read_text().splitlines()
    header, records = json.loads(lines[0]), [json.loads(line) for line in lines[1:]]
    first = next(r for r in records if r["node"] == "master" and r["msg"]["type"] == "stacks" and r["msg"].get("id"))
    stopped = next(r["msg"]["pid"] for r in records if r["msg"]["type"] == "rank" and r["msg"]["rank"] == header["rank"])
    native = {**first, "at": first["at"] + NATIVE_LATE, "msg": {**first["msg"], "t": first["msg"]["t"] + NATIVE_LATE}}
    first["msg"]["partial"] = [stopped]
    derived = sorted(records + [native], key=lambda r: r["at"])
    (folder / "stop-native-late.jsonl").write_text("\n".join(json.dumps(r) for r in [header, *derived]) + "\n")
    return header, first["at"], stopped


def test_a_stopped_rank_is_named_before_its_native_frames_come(tmp_path):
    header, python_at, stopped = _derive(tmp_path)
    assert (header["rank"], stopped) == (1, 1469)
    _, watcher, events = replay("stop-native-late", tmp_path, folder=tmp_path)
    said = [e for e in events if e.kind == "diagnosis"]
    assert len(said) == 1, [e.text for e in events]
    d = said[0].snapshot.diagnosis
    assert (d.kind, d.culprits, d.candidates, d.reason, d.certainty) == ("deadlock", [1], [], "stopped", "certain")
    assert summary(d) == ("rank 1 is stopped (SIGSTOP or a debugger: the kernel's state T) at hang_train.py:192 (main); "
                         "ranks 0,2,3 wait in all_reduce")
    # Said with the Python frames (the old code waited for the native ones, NATIVE_LATE s on).
    assert said[0].data["at"] < python_at + NATIVE_LATE
    assert said[0].data["at"] - header["fault_at"] <= stall.DEFAULT_THRESHOLD + 2
