"""No false alarm (issue 35), on the lab: a real 2-node x 2-rank Gloo run of tests/lab/soak_train.py.
A slow straggler is never a hang; rank 0 asleep for 60 s in save_checkpoint() while the others wait
in barrier() is a likely stall naming rank 0, its function and its line, never certain before its
bound and never stopped by --stop-on-hang; a rank blocked reading its stdin is named as such."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from .hangjob import STARTUP
from .test_launch_lab import REPO, _line, assert_nothing_left, command, counts, said

SOAK = Path(__file__).parent / "soak_train.py"


def _verdicts(watch) -> list[dict]:
    """Every verdict the watch said (hang or not), as its JSON holds it."""
    return [e["snapshot"]["diagnosis"] for e in watch.events
            if e["event"] in ("diagnosis", "notice", "straggler") and (e.get("snapshot") or {}).get("diagnosis")]


def test_a_rank_that_sleeps_4_s_a_step_is_never_a_hang(watched):
    # Rank 1 sleeps 4 s in every step; ranks 0,2,3 wait for it in all_reduce at ~0% CPU, and
    # each step's all_reduce moves bytes on every rank's connections: progress, not a stall.
    watch, job = watched("--steps", "14", "--straggler", "1", "--straggle", "4", port=29761, script=SOAK)
    codes = job.wait(STARTUP + 14 * 4 + 60)
    assert codes == [0, 0], job.said()
    found = [(d["kind"], d["culprits"], d["certainty"]) for d in _verdicts(watch)]
    assert all(kind == "straggler" for kind, _, _ in found), found
    assert not watch.of("diagnosis") and not watch.of("incident"), [e["text"] for e in watch.events]


def test_a_rank_reading_its_stdin_is_named_reading_stdin_and_held(watched):
    watch, job = watched("--steps", "400", "--stdin-rank", "3", "--stdin-at", "3", port=29762, script=SOAK)
    began = job.fault_time()
    e = watch.wait_for("notice", 40, where=lambda e: ((e.get("snapshot") or {}).get("diagnosis") or {})
                       .get("kind") == "held")
    d = e["snapshot"]["diagnosis"]
    assert (d["kind"], d["culprits"], d["candidates"], d["reason"], d["certainty"]) == \
        ("held", [3], [], "waits-to-receive", "likely"), d
    [mine] = [r for r in d["evidence"] if r["rank"] == 3]
    line = _line(SOAK, "            sys.stdin.readline()")
    assert mine["op"] == "stdin (a pipe)" and mine["frame"] == f"tests/lab/soak_train.py:{line}", mine
    assert e["text"].startswith("rank 3 waits to receive on stdin (a pipe) outside any collective: idle at "
                                f"tests/lab/soak_train.py:{line} (main); ranks 0,1,2 wait in "), e["text"]
    assert e["time"] - began <= 8.0 + 20, e["time"] - began
    assert not watch.of("diagnosis"), [x["text"] for x in watch.of("diagnosis")]


def test_rank_0_checkpointing_60_s_is_held_likely_and_never_stopped_by_stop_on_hang(clean_lab, tmp_path):
    # Rank 0 sleeps 60 s in save_checkpoint() at step 3 while ranks 1,2,3 wait in barrier(): a stall
    # said as likely, naming rank 0, save_checkpoint and its line; the run goes on and finishes.
    before = counts(clean_lab)
    argv = command(clean_lab, tmp_path, "--no-probes", "--stop-on-hang")
    argv = argv[:argv.index("--") + 1] + [str(SOAK), "--steps", "5", "--checkpoint-every", "3",
                                          "--checkpoint-seconds", "60"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=STARTUP + 240, cwd=REPO)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 0, said(done)
    line = _line(SOAK, "    time.sleep(seconds)")
    held = [x for x in done.stderr.splitlines() if x.startswith("ddp-preflight: hangwatch: rank 0 sleeps outside")]
    assert held and held[0].startswith(
        f"ddp-preflight: hangwatch: rank 0 sleeps outside any collective: idle at tests/lab/soak_train.py:{line} "
        "(save_checkpoint); ranks 1,2,3 wait in barrier") and "; likely a stall (" in held[0] and \
        held[0].endswith("which may end by itself; a hang if it lasts 300 s"), said(done)
    assert "DEADLOCK" not in done.stderr and "--stop-on-hang" not in said(done), said(done)
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["verdict"] is None or result["verdict"].get("kind") not in ("deadlock", "held"), result["verdict"]
    assert not (tmp_path / "run" / "incidents").exists() or not list((tmp_path / "run" / "incidents").iterdir())
    assert_nothing_left(clean_lab, before)
