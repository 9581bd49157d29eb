"""A run's ends are judged once the exit message of every rank its agent found has come. CI
(--launch, the box loaded: each rank at 9% CPU): rank 3 finished its loop cleanly at step 5 and
exited 0, the others then lost their peer. The sample that found rank 3 gone came before the agent's
exit message (its code and its own record of its end), and the ends were judged 2 s later without
them: "rank 3 ended first (exit code 0), before any other rank: its own error or a lost peer, which
its exit alone cannot tell", where the launcher, reading the records at the end, said "left first".

DERIVED from quit.jsonl (recorded: rank 3 quits at step 5 and exits 0, its exit message at 7.79 s
carries its record, how: "ended", code 0): worker1's sample at 7.7 s already lists rank 3 gone, and
its exit message comes LATE s after it."""

from __future__ import annotations

import copy
import json

from ddp_preflight.hangwatch.text import summary

from .test_hangwatch_watch import AGENT, replay

LATE = 5.0


def _late_exit(tmp_path) -> str:
    lines = (AGENT / "quit.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    records = [json.loads(line) for line in lines[1:]]
    exit3 = next(r for r in records if r["msg"]["type"] == "exit" and r["node"] == "worker1" and r["msg"]["code"] == 0)
    pid = exit3["msg"]["pid"]
    out = []
    for r in records:
        if r is exit3:
            continue
        if r["node"] == "worker1" and r["msg"]["type"] == "sample" and r["at"] < exit3["at"] and \
                any(s["pid"] == pid for s in r["msg"]["ranks"]) and r["at"] > header["fault_at"]:
            msg = copy.deepcopy(r["msg"])
            msg["ranks"] = [s for s in msg["ranks"] if s["pid"] != pid]
            msg["gone"] = [pid]
            r = {**r, "msg": msg}
        out.append(r)
    out.append({**exit3, "at": exit3["at"] + LATE})
    out.sort(key=lambda r: r["at"])
    (tmp_path / "quit-late.jsonl").write_text("\n".join(json.dumps(x) for x in [header, *out]) + "\n")
    return "quit-late"


LEFT_FIRST = "rank 3 on worker1 left first, while the others still ran (exit code 0)"


def test_the_recorded_clean_exit_first_is_left_first(tmp_path):
    header, watcher, events = replay("quit", tmp_path)
    d = next(e for e in events if e.kind == "diagnosis").snapshot.diagnosis
    assert (d.kind, d.culprits, d.candidates, d.reason, d.certainty) == ("exited", [3], [], "left-first", "certain")
    assert summary(d).startswith(LEFT_FIRST), summary(d)


def test_a_rank_seen_gone_before_its_exit_message_is_judged_with_it(tmp_path):
    header, watcher, events = replay(_late_exit(tmp_path), tmp_path, folder=tmp_path)
    said = [e for e in events if e.kind == "diagnosis"]
    assert len(said) == 1, [e.text for e in said]
    d = said[0].snapshot.diagnosis
    assert (d.kind, d.culprits, d.candidates, d.reason, d.certainty) == ("exited", [3], [], "left-first", "certain")
    assert summary(d).startswith(LEFT_FIRST), summary(d)
