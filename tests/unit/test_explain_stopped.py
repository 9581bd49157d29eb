"""A run stopped from outside (issue 37): a SIGTERM or SIGHUP to torchrun's agent (a scheduler's cancel, a
supervising platform, kill, a closed shell) and Slurm ending a job for a reason it names are consequences,
never a root, and none of them says the run hung: not the Ctrl-C reading (a person stopping a stuck run)
and not its Flight Recorder fix. The fix is the sender's record (Slurm's sacct where the paste shows Slurm)
or what the named reason asks for. Variants nobody pasted: every wording of the signal (torch 1.9's
logging form, glog's, the agent's SignalException), every Slurm reason, with and without a rank's own error
that outranks them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddp_preflight.explain import explain
from ddp_preflight.explain.render import as_json

AGENT = "torch/distributed/elastic/agent/server/api.py"


def said(tmp_path: Path, text: str) -> tuple[tuple | None, str | None]:
    path = tmp_path / "paste.log"
    path.write_text(text)
    e = explain([str(path)])
    f = e.finding
    answer = None if f is None else (f.kind.value, list(f.culprits), f.sure.value, f.cause.value, f.message)
    return answer, json.loads(as_json(e))["fix"]


@pytest.mark.parametrize("line", [
    f"W0101 00:00:00.000000 1 {AGENT}:723] Received 15 death signal, shutting down workers",
    f"W0101 00:00:00.000000 1 {AGENT}:688] Received Signals.SIGTERM death signal, shutting down workers",
    "WARNING:torch.distributed.elastic.agent.server.api:Received 15 death signal, shutting down workers",
    "[2024-02-27 21:35:32,106] torch.distributed.elastic.agent.server.api: [WARNING] Received 15 death signal, "
    "shutting down workers",
    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 3113 got signal: 15",
])
def test_a_sigterm_from_outside_is_an_end_never_a_hang(tmp_path, line):
    stop = "W0101 00:00:00.000000 1 torch/distributed/elastic/multiprocessing/api.py:900] Sending process 41 closing " \
           "signal SIGTERM\n"
    answer, fix = said(tmp_path, line + "\n" + stop)
    assert answer == ("exited", [], "unknown", "unknown", "stopped-from-outside")
    assert fix is not None and fix.startswith("ddp-preflight explain <every node's log> <the log of what started")
    assert "Flight Recorder" not in fix and "hangwatch" not in fix


@pytest.mark.parametrize("line", [
    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 3113 got signal: 2",
    f"W0101 00:00:00.000000 1 {AGENT}:688] Received Signals.SIGINT death signal, shutting down workers",
    "WARNING:torch.distributed.elastic.agent.server.api:Received 2 death signal, shutting down workers",
    "KeyboardInterrupt",
])
def test_a_ctrl_c_keeps_the_stuck_runs_reading(tmp_path, line):
    answer, fix = said(tmp_path, line + "\n")
    assert answer == ("timeout-unknown-root", [], "unknown", "unknown-collect-flight-recorder", "stopped-by-hand")
    assert fix is not None and "Flight Recorder" in fix


def test_under_slurm_the_senders_record_is_sacct(tmp_path):
    text = ("srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n"
            f"0: W0101 00:00:00.000000 1 {AGENT}:723] Received 15 death signal, shutting down workers\n")
    answer, fix = said(tmp_path, text)
    assert answer == ("exited", [], "unknown", "unknown", "stopped-from-outside")
    assert fix is not None and fix.startswith("sacct -j JOBID -o JobID,State,ExitCode,Elapsed,Timelimit,NodeList")


@pytest.mark.parametrize("reason,message,words", [
    ("TIME LIMIT", "scheduler-time-limit", "#SBATCH --time"),
    ("PREEMPTION", "scheduler-preempted", "#SBATCH --requeue"),
    ("NODE FAILURE", "scheduler-node-failure", "sinfo -R"),
])
@pytest.mark.parametrize("what", ["JOB 37361369", "STEP 37361369.0"])
def test_slurms_named_reason_is_the_ends_reason_and_its_fix(tmp_path, reason, message, words, what):
    text = ("epoch 3 step 1200 loss 2.31\n"
            f"slurmstepd: error: *** {what} ON learnfair5146 CANCELLED AT 2021-03-15T18:00:46 DUE TO {reason} ***\n"
            "srun: error: learnfair5146: tasks 0-7: Terminated\n"
            f"W0101 00:00:00.000000 1 {AGENT}:723] Received 15 death signal, shutting down workers\n")
    answer, fix = said(tmp_path, text)
    assert answer == ("exited", [], "certain", "unknown", message)
    assert fix is not None and words in fix and "Flight Recorder" not in fix


def test_a_ranks_own_error_outranks_the_time_limit_and_the_sigterm(tmp_path):
    text = ("[rank1]: Traceback (most recent call last):\n"
            "[rank1]:   File \"train.py\", line 40, in <module>\n"
            "[rank1]: ValueError: bad shard\n"
            "slurmstepd: error: *** JOB 82 ON gpu-07 CANCELLED AT 2024-04-20T09:09:37 DUE TO TIME LIMIT ***\n"
            f"W0101 00:00:00.000000 1 {AGENT}:723] Received 15 death signal, shutting down workers\n")
    answer, _ = said(tmp_path, text)
    assert answer is not None and answer[:4] == ("exited", [1], "certain", "python-exception")


def test_a_slurm_cancel_without_a_reason_is_not_taken_for_one(tmp_path):
    text = "slurmstepd: error: *** STEP 6053.0 ON DEL2212S020 CANCELLED AT 2024-04-23T12:18:08 ***\n"
    answer, _ = said(tmp_path, text)
    assert answer == ("timeout-unknown-root", [], "unknown", "unknown-collect-flight-recorder", "scheduler-stopped")


# SIGHUP: the terminal or ssh session closed (corpus 344-350: nohup does not keep torchrun); every wording the
# agent prints, and the SIGHUP it passes on to its ranks alone (corpus 346)
@pytest.mark.parametrize("line", [
    f"W0101 00:00:00.000000 1 {AGENT}:719] Received 1 death signal, shutting down workers",
    "WARNING:torch.distributed.elastic.agent.server.api:Received Signals.SIGHUP death signal, shutting down workers",
    "[16:21:34] WARNING  Received 1 death signal, shutting down workers    api.py:729",
    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 2890585 got signal: 1",
    "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 102241 closing signal SIGHUP",
    "W0101 00:00:00.000000 1 torch/distributed/elastic/multiprocessing/api.py:766] Closing process 41 via signal SIGHUP",
])
def test_a_sighup_is_the_closed_terminal_and_its_fix_a_session_that_stays(tmp_path, line):
    answer, fix = said(tmp_path, line + "\n")
    assert answer == ("exited", [], "certain", "unknown", "stopped-by-hangup")
    assert fix is not None and fix.startswith("run it in tmux or screen") and "Flight Recorder" not in fix


def test_a_ranks_own_error_outranks_the_sighup(tmp_path):
    text = ("[rank0]: Traceback (most recent call last):\n[rank0]:   File \"train.py\", line 9, in <module>\n"
            "[rank0]: KeyError: 'labels'\n"
            f"W0101 00:00:00.000000 1 {AGENT}:719] Received 1 death signal, shutting down workers\n")
    answer, _ = said(tmp_path, text)
    assert answer is not None and answer[:4] == ("exited", [0], "certain", "python-exception")
