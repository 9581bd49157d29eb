"""The store's and Slurm's words in every wording their sources print, not only the recorded pastes'
(tests/unit/artifacts/pasted/206, 211, 214): the store's side of a rendezvous nobody joined ("clients",
or "workers" in the PR that added it), the client's side in torch 2.x's socket.cpp wordings (every
address refused it, one address refused it), and Slurm stopping a step (scancel, its time limit) or
srun reporting a task it terminated: a consequence that never outranks a rank's own error."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_preflight.explain import explain
from ddp_preflight.rules import failures


@pytest.mark.parametrize("line,store", [
    ("torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/3 clients joined.", None),
    ("torch.distributed.DistStoreError: Timed out after 6 seconds waiting for workers. 1/2 workers joined.", None),
    ("RuntimeError: The client socket has failed to connect to any network address of (node1, 29500). The client "
     "socket has failed to connect to [node1]:29500 (errno: 111 - Connection refused).", "node1:29500"),
    ("[W socket.cpp:663] [c10d] The client socket has failed to connect to [10.0.0.5]:29400 (errno: 113 - No route "
     "to host).", "10.0.0.5:29400"),
    ("torch.distributed.DistNetworkError: The client socket has failed to connect to any network address of "
     "(0.15.4.33,39213).", "0.15.4.33:39213"),
])
def test_each_wording_of_a_store_nobody_reached_is_the_store_unreachable(line, store):
    [found] = [f for f in failures.find(line) if f.message.part is failures.Part.ROOT]
    assert (found.message.id, found.message.cause) == ("store-client-timeout", failures.Cause.STORE_UNREACHABLE)
    g = found.groups
    said = next((f"{g['host' + n]}:{g['port' + n]}" for n in ("", "2", "3") if g.get("host" + n)), None)
    assert said == store


# a step Slurm stopped for a reason it names is that reason's (rules/failures_stopped.py), not "stopped: if it hung"
@pytest.mark.parametrize("line,id,part", [
    ("slurmstepd: error: *** STEP 6053.0 ON DEL2212S020 CANCELLED AT 2024-04-23T12:18:08 ***", "scheduler-stopped",
     failures.Part.TIMEOUT),
    ("slurmstepd: error: *** JOB 494583 ON gpu-07 CANCELLED AT 2024-04-20T09:09:37 DUE TO TIME LIMIT ***",
     "scheduler-time-limit", failures.Part.VICTIM),
    ("srun: error: node12: tasks 0-3: Terminated", "scheduler-stopped", failures.Part.TIMEOUT),
    ("srun: error: DEL2212S020: task 0: Terminated", "scheduler-stopped", failures.Part.TIMEOUT),
])
def test_slurm_stopping_a_step_is_read_as_a_consequence(line, id, part):
    [found] = failures.find(line)
    assert (found.message.id, found.message.part) == (id, part)


def test_a_users_own_terminated_word_is_not_slurms():
    assert failures.find("worker pool: task 3: Terminated by user request") == []


def test_a_ranks_own_error_outranks_slurm_terminating_the_others(tmp_path: Path):
    log = tmp_path / "slurm-81.out"
    log.write_text("1: Traceback (most recent call last):\n"
                   "1:   File \"train.py\", line 40, in <module>\n"
                   "1: ValueError: bad shard\n"
                   "srun: error: node2: task 1: Exited with exit code 1\n"
                   "slurmstepd: error: *** STEP 81.0 ON node1 CANCELLED AT 2024-05-01T10:00:00 ***\n"
                   "srun: error: node1: task 0: Terminated\n")
    f = explain([str(log)]).finding
    assert f is not None
    assert (f.kind.value, f.cause.value, f.culprits) == ("exited", "python-exception", (1,))


def test_a_job_slurm_ended_at_its_time_limit_names_no_one_and_gives_the_limits_fix(tmp_path: Path):
    log = tmp_path / "slurm-82.out"
    log.write_text("epoch 3 step 1200 loss 2.31\n"
                   "slurmstepd: error: *** JOB 82 ON gpu-07 CANCELLED AT 2024-04-20T09:09:37 DUE TO TIME LIMIT ***\n")
    f = explain([str(log)]).finding
    assert f is not None
    # a time limit ends a run, it does not say it hung (issue 37: it had the Flight Recorder's fix): the reason's fix
    assert (f.kind.value, f.cause.value, f.culprits, f.message) == ("exited", "unknown", (), "scheduler-time-limit")
    assert f.fix is not None and "#SBATCH --time" in f.fix.text()
