"""A probe's job that gives no result says why, never an empty reason (issue 38: under load,
path-mtu's "error: the probe gave no result: " with nothing after it). Each end as the node's
supervisor reports it (node/supervisor.py's outcome fields), and one real job's."""

from __future__ import annotations

import pytest

from preflight.probes.job_end import why_ended
from transport.node import JobResult


@pytest.mark.parametrize("result, said", [
    (JobResult("worker1", timed_out=True, seconds=55.2, signal=15),
     "its node's supervisor ended it at its bound of 55 s, after 55 s: the node was too slow to finish (load), or "
     "it waited on a peer"),
    (JobResult("worker1", stopped="master-silent", signal=15, seconds=12.0),
     "its node's supervisor stopped it after 12 s: ddp-preflight's line to the node went silent for longer than its "
     "lease (this machine too slow to answer, or the link lost)"),
    (JobResult("worker1", stopped="asked", signal=15, seconds=3.0, stderr="Traceback ...\nKeyboardInterrupt\n"),
     "ddp-preflight stopped it after 3 s, before it reported; its last words: KeyboardInterrupt"),
    (JobResult("worker1", signal=9, seconds=7.0),
     "it was killed by SIGKILL after 7 s, from outside ddp-preflight (neither its bound nor a stop of ours: another "
     "process, or the OOM killer)"),
    (JobResult("worker1", exit=1, seconds=0.4, stderr="OSError: [Errno 99] Cannot assign requested address\n"),
     "it exited with code 1 after 0 s; its last words: OSError: [Errno 99] Cannot assign requested address"),
    (JobResult("worker1", exit=0, seconds=1.0), "it ended after 1 s without its result line, saying nothing"),
    (JobResult("worker1", error="the job's outcome was lost"), "the job's outcome was lost"),
])
def test_every_end_is_said_with_who_ended_it(result, said):
    assert why_ended(result, 55) == said


def test_a_real_job_killed_at_its_bound_says_so():
    import sys

    from transport.local import LocalNode

    # The path-MTU echo, told to live 30 s, under a bound of 1.5 s: its supervisor ends it.
    job = LocalNode("here", sys.executable).job(
        {"program": "pathmtu", "mode": "echo", "address": "127.0.0.1", "interface": "lo", "token": "ab" * 16,
         "duration": 30}, timeout=1.5)
    result = job.wait(20)
    assert result.timed_out
    assert why_ended(result, 1.5).startswith("its node's supervisor ended it at its bound of 2 s, after ")
