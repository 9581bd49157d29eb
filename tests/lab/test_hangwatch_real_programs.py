"""hangwatch on the ways real programs break its old idea of "waiting" (issue 12), on real 2-node
x 2-rank Gloo training in the lab: a rank that waits in C++ under its own Python frame
(work.wait() in the seed's wrapper, a future's wait()), children that inherit RANK, a rank that
computes for ever, and a rank that leaves cleanly first."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ddp_preflight.hangwatch.stall import DEFAULT_THRESHOLD

from .hangjob import SCRIPT, cmdline_of, went_first
from .test_launch_lab import CLI, NODES, REPO, assert_nothing_left, counts

pytestmark = pytest.mark.timeout(300)


def _line(text: str) -> int:
    return next(i for i, line in enumerate(SCRIPT.read_text().splitlines(), 1) if text in line)


@pytest.mark.parametrize("wait, line", [("work", "self._work.wait()"),
                                        ("future", "async_op=True).get_future().wait()")])
def test_a_rank_waiting_in_cxx_under_its_own_frame_is_a_waiter_and_the_rank_that_left_is_named(watched, wait, line):
    watch, job = watched("--steps", "500", "--fault", "leave", "--rank", "3", "--at", "5", "--wait", wait,
                         port=29641 if wait == "work" else 29642)
    left_at = job.fault_time()
    event = watch.wait_for("diagnosis", DEFAULT_THRESHOLD + 20)
    diagnosis = event["snapshot"]["diagnosis"]
    assert diagnosis["kind"] == "deadlock" and diagnosis["culprits"] == [3], diagnosis
    assert f"rank 3 left the loop: idle at hang_train.py:{_line('time.sleep(3600)')}" in diagnosis["summary"]
    op = "Work.wait()" if wait == "work" else "Future.wait()"
    assert f"ranks 0,1,2 wait in {op}" in diagnosis["summary"], diagnosis["summary"]
    waiting = {r["rank"]: r for r in event["snapshot"]["ranks"]}
    assert all(waiting[r]["frame"] == f"hang_train.py:{_line(line)}" for r in (0, 1, 2)), waiting
    assert event["time"] - left_at <= DEFAULT_THRESHOLD + 2


def test_children_that_inherit_rank_are_never_ranks(watched, clean_lab):
    watch, job = watched("--steps", "500", "--fault", "child", "--rank", "2", "--at", "5", port=29643)
    job.fault_time()
    children = []
    try:
        diagnosis = watch.wait_for("diagnosis", DEFAULT_THRESHOLD + 20)["snapshot"]["diagnosis"]
        # The children are there, with rank 2's environment (RANK included), and not taken for ranks.
        children = [p for p in clean_lab.processes("worker1")
                    if "sleep(7200)" in cmdline_of(p) or "sleep 3600" in cmdline_of(p)]
        assert len(children) >= 2, children
        assert all("RANK=2" in Path(f"/proc/{p}/environ").read_bytes().decode(errors="replace").split("\0")
                   for p in children)
        assert diagnosis["kind"] == "deadlock" and diagnosis["culprits"] == [2], diagnosis
        found = watch.of("rank-found")
        assert sorted(e["rank"] for e in found) == [0, 1, 2, 3], [e["text"] for e in found]
        assert not any(e["pid"] in children for e in found)
    finally:
        for pid in children:          # started by this test's job: they outlive their rank otherwise
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_rank_that_computes_for_ever_is_named_after_the_bound(watched):
    watch, job = watched("--steps", "500", "--fault", "endless", "--rank", "1", "--at", "5", port=29644,
                         watch_args=("--endless-after", "20"))
    started = job.fault_time()
    straggler = watch.wait_for("straggler", DEFAULT_THRESHOLD + 20)["snapshot"]["diagnosis"]
    # The notice names the ranks the evidence shows computing: rank 1, and (CI, loaded) a rank still
    # in its own step then, at a line its stack showed (rank 0) or busy before its stack was read
    # (rank 2, "rank 2 is computing"). Exactly those; the verdict below, once the others have waited
    # past the bound, names rank 1 alone.
    computing = sorted(e["rank"] for e in straggler["evidence"] if e["state"] in ("computing", "running"))
    assert 1 in computing and straggler["culprits"] == computing, straggler["summary"]
    event = watch.wait_for("diagnosis", 20 + DEFAULT_THRESHOLD + 20)
    diagnosis = event["snapshot"]["diagnosis"]
    assert diagnosis["kind"] == "endless" and diagnosis["culprits"] == [1], diagnosis
    assert re.search(r"rank 1 has computed for \d+ s at hang_train.py:\d+", diagnosis["summary"]), diagnosis
    assert "never reaches all_reduce, where ranks 0,2,3 wait" in diagnosis["summary"]
    # The others' wait is dated from the samples that found them idle, back to the part of the
    # sample before it that they did not use: up to two samples (2 s) before they really began.
    assert 20 - 2.5 <= event["time"] - started <= 20 + DEFAULT_THRESHOLD + 4


def test_a_rank_that_leaves_cleanly_first_is_named_not_the_peer_it_made_fail(clean_lab, tmp_path):
    """Under --launch: rank 3 finishes early (exit code 0); its Gloo peers then fail. Both hangwatch
    and the launcher's summary name rank 3."""
    before = counts(clean_lab)
    argv = [*CLI, *NODES, "--ssh-config", str(clean_lab.ssh_config), "--launch", "--nproc-per-node", "2",
            "--no-probes", "--log-dir", str(tmp_path / "run"), "--", str(SCRIPT), "--steps", "500",
            "--fault", "quit", "--rank", "3", "--at", "5"]
    trace = tmp_path / "trace.jsonl"       # the launch's watcher's inputs, timed (hangwatch/watch.py)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=REPO,
                          env={**os.environ, "HANGWATCH_TRACE": str(trace)})
    assert "Traceback (most recent call last):\n  File \"/work" not in done.stderr
    assert done.returncode == 1, done.stderr[-3000:]
    # On failure: whether rank 3's exit message (its code, its record) came before its end was judged.
    assert "hangwatch: EXITED: rank 3 on worker1 left first, while the others still ran (exit code 0)" in done.stderr, \
        done.stderr[-3000:] + "\n" + _inputs(trace)
    headline = next(line for line in done.stderr.splitlines() if line.startswith("ddp-preflight: training failed"))
    assert headline.startswith("ddp-preflight: training failed: rank 3 on worker1 left first"), headline
    assert_nothing_left(clean_lab, before)


def _inputs(trace: Path) -> str:
    """The watcher's inputs but its samples, timed from its first: what came, and what it did."""
    steps = [json.loads(line) for line in trace.read_text().splitlines()] if trace.exists() else []
    return "\n".join(f"{s['wall'] - steps[0]['wall']:7.2f} {s['input']} {s['node'] or ''} {s['message'] or ''} "
                     f"-> {s['effects']}" for s in steps if s["message"] != "Sample")


@pytest.mark.parametrize("fault, rank, expected", [
    ("stop", 1, ("deadlock", [1], [], "stopped", "certain")),
    # Its worker blocks: held, likely (a worker that sleeps or reads a slow file looks the same).
    ("loader", 2, ("held", [2], [], "waits-for-data", "likely")),
    ("stuck", 0, ("deadlock", [0], [], "waits-on-lock", "certain")),
    ("recv", 3, ("deadlock", [], [0, 1, 2, 3], "wait-for-each-other", "unsure")),
    # Asleep in its loop: its wait may end by itself (issue 35), a held notice, likely, until 300 s.
    ("sleep", 2, ("held", [2], [], "sleeps", "likely")),
    # Attached without a Flight Recorder: the subgroup is told by its members' second Gloo mesh.
    ("subgroup", 1, ("mismatch", [1], [], "skipped-group", "likely")),
], ids=["sigstop", "dataloader-worker-hangs", "lock", "cycle-of-receives", "asleep-inside-its-loop",
        "subgroup-skipped-without-a-flight-recorder"])
def test_a_rank_stuck_outside_the_collective_is_named_with_why(watched, fault, rank, expected):
    # Each was told wrong or not at all before verdicts came from evidence (issue 16): a stopped rank
    # as a stall with no stacks, a hung loader as a straggler for ever, a cycle of receives as the
    # network.
    watch, job = watched("--steps", "500", "--fault", fault, "--rank", str(rank), "--at", "5", "--seconds", "600",
                         port={"stop": 29648, "loader": 29649, "stuck": 29650, "recv": 29651, "sleep": 29656,
                                   "subgroup": 29657}[fault])
    started = job.fault_time()
    if expected[0] == "held":    # a notice, never a hang verdict, before its bound
        event = watch.wait_for("notice", DEFAULT_THRESHOLD + 20,
                               where=lambda e: ((e.get("snapshot") or {}).get("diagnosis") or {}).get("kind") == "held")
    else:
        event = watch.wait_for("diagnosis", DEFAULT_THRESHOLD + 20)
    d = event["snapshot"]["diagnosis"]
    assert (d["kind"], d["culprits"], d["candidates"], d["reason"], d["certainty"]) == expected, \
        f"{d['summary']}\n{d['evidence']}\n{watch.timeline(started)}"
    assert event["time"] - started <= DEFAULT_THRESHOLD + 2, watch.timeline(started)
    if fault == "loader":        # the user's own line, not the C file the worker's queue waits in
        assert d["summary"].startswith(f"rank 2 waits for its data: loading-data at hang_train.py:"
                                       f"{_line('loss = train_step(model, optimizer, next(data))')} (main)"), d["summary"]
    if fault == "sleep":         # asleep inside its loop (its system call, its line in the for body): not "left the loop"
        assert d["summary"] == event["text"] == (
            f"rank 2 sleeps outside any collective: idle at hang_train.py:{_line('time.sleep(args.seconds)')} (main); "
            f"ranks 0,1,3 wait in all_reduce; likely a stall ({d['waited']:.0f} s so far), which may end by itself; "
            "a hang if it lasts 300 s"), d["summary"]
        assert d["bound"] == 300 and not watch.of("diagnosis"), [e["text"] for e in watch.of("diagnosis")]


def test_a_helper_started_through_a_shell_is_no_rank_and_no_hang(watched):
    # A healthy run: rank 1 starts `sh -c "python ...; true"` (its RANK inherited) and trains on.
    watch, job = watched("--steps", "150", "--fault", "shell", "--rank", "1", "--at", "5", port=29652)
    job.fault_time()
    assert job.wait(120) == [0, 0], job.lines[-10:]
    time.sleep(3)
    found = watch.of("rank-found")
    assert sorted(e["rank"] for e in found) == [0, 1, 2, 3], [e["text"] for e in found]
    assert not watch.of("diagnosis") and not watch.of("incident"), watch.of("diagnosis")


def test_an_uncaught_exception_is_the_rank_that_raised(watched):
    # Attached, output a pipe: rank 1's exit code 1 is what a lost peer gives too (once named as a
    # lost peer's death with three suspects); the kernel says which rank closed its connections first.
    watch, job = watched("--steps", "500", "--fault", "raise", "--rank", "1", "--at", "5", port=29653)
    job.fault_time()
    d = watch.wait_for("diagnosis", 30)["snapshot"]["diagnosis"]
    # Its error code is its own failure, as it went first; a SIGTERM from torchrun mid-teardown says
    # only that it was leaving.
    assert (d["kind"], d["culprits"], d["candidates"], d["reason"], d["certainty"]) == \
        ("exited", [1], [], went_first(d, 1), "certain"), d["summary"]
