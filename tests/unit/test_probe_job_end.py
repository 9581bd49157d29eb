"""A probe's job that gives no result says why, never an empty reason (issue 38: under load,
path-mtu's "error: the probe gave no result: " with nothing after it). Each end as the node's
supervisor reports it (node/supervisor.py's outcome fields), and one real job's."""

from __future__ import annotations

import pytest

from ddp_preflight.preflight.probes.job_end import why_ended
from ddp_preflight.transport.node import JobResult


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

    from ddp_preflight.transport.local import LocalNode

    # The path-MTU echo, told to live 30 s, under a bound of 1.5 s: its supervisor ends it.
    job = LocalNode("here", sys.executable).job(
        {"program": "pathmtu", "mode": "echo", "address": "127.0.0.1", "interface": "lo", "token": "ab" * 16,
         "duration": 30}, timeout=1.5)
    result = job.wait(20)
    assert result.timed_out
    assert why_ended(result, 1.5).startswith("its node's supervisor ended it at its bound of 2 s, after ")


def test_a_job_the_masters_wait_gave_up_on_says_whose_stop_ended_it_not_torchruns_signal():
    # Issue 38: under load the bandwidth probe said "SignalException ... signal 15; the cause is not
    # known": the SIGTERM was ours (the master's wait ran out, then its stop), said so now. A real
    # job that outlives the master's wait of 1 s, under a bound of 60 s on the node.
    import sys

    from ddp_preflight.preflight.probes.job_end import ended_by_us_or_outside
    from ddp_preflight.preflight.probes.torchjob import job_error
    from ddp_preflight.transport.local import LocalNode

    job = LocalNode("here", sys.executable).job(
        {"program": "pathmtu", "mode": "echo", "address": "127.0.0.1", "interface": "lo", "token": "ab" * 16,
         "duration": 30}, timeout=60)
    result = job.wait(1.0)
    assert result.outwaited == 1.0 and result.stopped == "asked" and not result.timed_out
    assert ended_by_us_or_outside(result)
    assert job_error(result).startswith("ddp-preflight stopped it when its own wait of 1 s for the job ran out; the "
                                        "job had run ")
    assert "bound there had not ended it (it started late, or ran slowly)" in job_error(result)


def test_a_loaded_node_gives_the_probes_more_time_up_to_a_bound_and_is_said_with_its_load():
    from ddp_preflight.preflight.probes.job_end import MOST_SLOWDOWN, load_words, slowdown
    from ddp_preflight.rules.facts import NodeFacts

    def node(name, load, cpus=2):
        return NodeFacts(name, {"cpu": {"logical_cores": cpus, "physical_cores": cpus, "usable_cores": cpus,
                                        "load_1m": load}})
    assert slowdown([node("master", 0.5), node("worker1", 1.9)]) == 1.0
    assert slowdown([node("master", 0.5), node("worker1", 5.0)]) == 2.5
    assert slowdown([node("master", 151.0)]) == MOST_SLOWDOWN
    assert slowdown([NodeFacts("old", {"cpu": {"logical_cores": 2, "physical_cores": 2}})]) == 1.0
    assert load_words(node("worker1", 151.0)) == "; worker1 was at load 151 on 2 CPUs"
    assert load_words(node("worker1", 1.5)) == ""
    # A load begun seconds ago: the minute's mean lags; the processes runnable now say it.
    now = NodeFacts("worker1", {"cpu": {"logical_cores": 2, "physical_cores": 2, "load_1m": 3.0, "runnable": 152}})
    assert slowdown([now]) == MOST_SLOWDOWN and load_words(now) == "; worker1 was at load 151 on 2 CPUs"
