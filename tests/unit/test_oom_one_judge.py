"""The kernel's OOM killer is read one way in every mode (issue 35): the live agent sees its node's
OOM-kill count rise as the rank ends, the files hold the kernel's own line ("Out of memory: Killed
process PID"); both become the rank's Ending.oom, and the one judge of ends (exits.read) says
oom-killed. Before, explain alone decided it, by its own rule: any OOM line beside any SIGKILLed
rank, so a line about another process (PID 4242) named rank 3 oom-killed too.

Derived from logs/sigkill (real: rank 3, pid 25358 on worker1, SIGKILLed; torchrun stopped the
others): the kernel's line appended to worker1's log, once for rank 3's process and once for
another."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ddp_preflight.explain import explain
from ddp_preflight.hangwatch import named
from ddp_preflight.hangwatch.model import Certainty, Kind, Reason

from .test_first_failure import _live

LOGS = Path(__file__).parent / "artifacts" / "logs"
LINE = "[2059991.491542] Out of memory: Killed process {pid} (python3) total-vm:53312244kB, anon-rss:31451456kB\n"


def _with_oom_line(tmp_path, pid: int) -> Path:
    folder = tmp_path / "sigkill"
    shutil.copytree(LOGS / "sigkill", folder)
    with (folder / "worker1.log").open("a") as log:
        log.write(LINE.format(pid=pid))
    return folder


@pytest.mark.parametrize("pid, reason", [(25358, Reason.OOM_KILLED), (4242, Reason.KILLED)])
def test_the_oom_killers_line_names_the_process_it_killed_and_no_other(pid, reason, tmp_path):
    e = explain([str(_with_oom_line(tmp_path, pid))])
    d = e.diagnosis
    assert d is not None and (d.kind, tuple(d.culprits), d.reason, d.certainty) == \
        (Kind.EXITED, (3,), reason, Certainty.CERTAIN)
    if reason is Reason.OOM_KILLED:
        assert e.quotes[0].text == LINE.format(pid=pid).strip()


def test_live_and_explain_say_oom_killed_of_the_same_end(tmp_path):
    # Live: the same ends, the agent's word that worker1's OOM-kill count rose as rank 3 ended.
    from ddp_preflight.explain import inputs
    from ddp_preflight.explain.ended import ended, ending_of, ooms_of
    from ddp_preflight.explain.gather import gather
    g = gather(inputs.find([str(_with_oom_line(tmp_path, 25358))]))
    endings = [ending_of(r, ooms_of(g)) for r in ended(g)]
    assert [e.rank for e in endings if e.oom] == [3]
    live = named.judge(endings)
    assert live is not None and (live.kind, tuple(live.culprits), live.reason) == (Kind.EXITED, (3,), Reason.OOM_KILLED)
    plain = _live(gather(inputs.find([str(LOGS / "sigkill")])), tmp_path)     # no OOM evidence: killed
    assert plain is not None and plain.reason is Reason.KILLED
