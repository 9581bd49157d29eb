"""One judge for a launch and for explain of its folder, on the lab (issue 35): what torchrun's
own lines name is the launch's verdict, in its summary and its result.json, as explain says it."""

from __future__ import annotations

import json

from explain import explain
from hangwatch.model import Kind, Reason

from .test_launch_lab import launch, said


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
