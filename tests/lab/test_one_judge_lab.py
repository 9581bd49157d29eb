"""One judge for a launch and for explain of its folder, on the lab (issue 35): what torchrun's
own lines name is the launch's verdict, in its summary and its result.json, as explain says it."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from ddp_preflight.explain import explain
from ddp_preflight.hangwatch.model import Kind, Reason

from .test_launch_lab import launch, said, start_and_wait_for_steps


def test_a_busy_master_port_is_the_launchs_verdict_as_explain_says_it(clean_lab, tmp_path):
    # Before: "training failed: torchrun on master ended with exit code 1" (hangwatch followed no
    # rank, so the run had no verdict), while explain of the same folder named the busy port.
    clean_lab.add_fault("port-busy@master")
    try:
        done = launch(clean_lab, tmp_path, "--no-probes", "--force")
    finally:
        clean_lab.clear_faults()
    assert done.returncode == 1, said(done)
    assert ("ddp-preflight: training failed: torchrun on master could not listen on the master port 29500: it is "
            "in use (EADDRINUSE); no rank started; every node was stopped") in done.stderr.splitlines(), said(done)
    verdict = json.loads((tmp_path / "run" / "result.json").read_text())["verdict"]
    assert (verdict["kind"], verdict["reason"], verdict["nodes"]) == ("exited", "port-in-use", ["master"])
    e = explain([str(tmp_path / "run")])
    assert e.diagnosis is not None and (e.diagnosis.kind, e.diagnosis.reason, tuple(e.diagnosis.nodes)) == \
        (Kind.EXITED, Reason.PORT_IN_USE, ("master",))


def _rank_pid(rank: int, script: str) -> int:
    """A running rank of this box's lab (its pid: the namespaces share this machine's), by RANK in
    its environment and its script on its command line."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if script.encode() in cmdline and f"RANK={rank}".encode() in env and b"LOCAL_RANK=1" in env:
            return int(entry.name)
    raise AssertionError(f"rank {rank} of {script} is not running")


def test_a_rank_killed_from_outside_is_the_culprit_in_the_summary_result_json_and_explain(clean_lab, tmp_path):
    # Issue 35: live said "rank 3 was killed (SIGKILL)", but result.json and explain said "rank 0 lost
    # its peer ... no rank ended before it", and the summary put rank 3's end on its launcher.
    proc = start_and_wait_for_steps(clean_lab, tmp_path)
    try:
        os.kill(_rank_pid(3, "train_ddp.py"), signal.SIGKILL)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, stderr[-3000:]
    assert "  rank 3 on worker1: signal 9 (SIGKILL)" in stderr.splitlines(), stderr[-3000:]
    assert any(line.startswith("ddp-preflight: training failed: rank 3 on worker1 was killed (signal 9, SIGKILL)")
               for line in stderr.splitlines()), stderr[-3000:]
    verdict = json.loads((tmp_path / "run" / "result.json").read_text())["verdict"]
    assert (verdict["kind"], verdict["culprits"], verdict["reason"]) == ("exited", [3], "killed"), verdict
    d = explain([str(tmp_path / "run")]).diagnosis
    assert d is not None and (d.kind, tuple(d.culprits), d.reason) == (Kind.EXITED, (3,), Reason.KILLED)
