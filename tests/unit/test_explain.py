"""`ddp-preflight explain` on real failure logs: each recorded run (tests/unit/artifacts/logs/ and
tests/unit/artifacts/explain/, each with the command that made it) gets its exact verdict: kind,
the ranks named, why, and the lines it rests on (file:line)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_preflight.explain import explain
from ddp_preflight.explain.inputs import InputError
from ddp_preflight.hangwatch.model import Certainty, Kind, Reason
from ddp_preflight.hangwatch.text import summary
from ddp_preflight.rules.failures import Cause

ART = Path(__file__).parent / "artifacts"
LOGS, CORPUS = ART / "logs", ART / "explain"


def verdict(*paths: Path):
    e = explain([str(p) for p in paths])
    assert e.diagnosis is not None
    d = e.diagnosis
    return e, d


# kind, culprits, candidates, reason, certainty
EXPECTED = {
    "raise": (Kind.EXITED, [1], [], Reason.RAISED, Certainty.CERTAIN),
    "raise-notee": (Kind.EXITED, [1], [], Reason.RAISED, Certainty.CERTAIN),
    "launch-raise": (Kind.EXITED, [3], [], Reason.RAISED, Certainty.CERTAIN),
    "chained": (Kind.EXITED, [1], [], Reason.RAISED, Certainty.CERTAIN),
    "loader": (Kind.EXITED, [1], [], Reason.RAISED, Certainty.CERTAIN),
    "exit": (Kind.EXITED, [3], [], Reason.EXIT_CODE, Certainty.LIKELY),
    "exit-abort": (Kind.EXITED, [3], [], Reason.RAISED, Certainty.CERTAIN),
    "quit": (Kind.EXITED, [1], [], Reason.LEFT_FIRST, Certainty.LIKELY),
    "quit-work": (Kind.EXITED, [1], [], Reason.LEFT_FIRST, Certainty.LIKELY),
    "quit-r3": (Kind.EXITED, [3], [], Reason.LEFT_FIRST, Certainty.LIKELY),
    "quit-abort": (Kind.EXITED, [3], [], Reason.RAISED, Certainty.CERTAIN),
    "sigkill": (Kind.EXITED, [3], [], Reason.KILLED, Certainty.CERTAIN),
    "sigkill-reset": (Kind.EXITED, [3], [], Reason.KILLED, Certainty.CERTAIN),
    "timeout": (Kind.EXITED, [1], [], Reason.BEHIND, Certainty.LIKELY),
    "reset": (Kind.EXITED, [], [], Reason.LOST_PEER, Certainty.LIKELY),
    "vpn-ipv6": (Kind.EXITED, [2, 3], [], Reason.ADDRESS_FAMILY, Certainty.CERTAIN),
    "firewall": (Kind.RENDEZVOUS_STALL, [], [], Reason.CANNOT_CONNECT, Certainty.CERTAIN),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_recorded_failure_gets_its_exact_verdict(name):
    _, d = verdict(LOGS / name)
    assert (d.kind, list(d.culprits), list(d.candidates), d.reason, d.certainty) == EXPECTED[name]


CORPUS_EXPECTED = {
    "getfuture": (Kind.EXITED, [0, 1, 2, 3], [], Reason.UNSUPPORTED, Certainty.CERTAIN),
    "large-timeout": (Kind.NETWORK_STALL, [0, 1, 2, 3], [], Reason.TIMED_OUT, Certainty.LIKELY),
    "port-busy": (Kind.EXITED, [], [], Reason.PORT_IN_USE, Certainty.CERTAIN),
    "refused": (Kind.RENDEZVOUS_STALL, [], [], Reason.CANNOT_CONNECT, Certainty.CERTAIN),
    "rendezvous-timeout": (Kind.RENDEZVOUS_STALL, [], [], Reason.CANNOT_REACH_STORE, Certainty.CERTAIN),
    "swallowed": (Kind.EXITED, [], [], Reason.SCRIPT_OPTIONS, Certainty.CERTAIN),
    "nanogpt-cpu": (Kind.EXITED, [0, 1], [], Reason.RAISED, Certainty.CERTAIN),
}


def test_nanogpts_cuda_pin_on_a_cpu_run_is_named_with_the_fix_that_fits_not_torchruns_tee():
    # Issue 38: nanoGPT's own command on CPU (train.py:89 torch.cuda.set_device on a CPU build of
    # torch) got the generic "torchrun --log-dir=LOGS --tee=3", though both ranks' tracebacks were
    # in the log. The cause is CUDA used where torch has none, at the line the tracebacks show.
    e, _ = verdict(CORPUS / "nanogpt-cpu")
    assert e.finding is not None and e.finding.cause is Cause.NO_CUDA and e.finding.message == "no-cuda"
    assert e.fix is not None and e.fix.text() == (
        "on a CPU run, put the CUDA calls at the line shown (torch.cuda.set_device, .cuda(), device='cuda') under "
        "`if torch.cuda.is_available():`, so each rank keeps the CPU device it was given; on a GPU run, a CUDA build "
        "of torch on a node whose GPU and driver it sees (nvidia-smi)")
    from ddp_preflight.explain.render import as_text

    text = as_text(e)
    assert text.splitlines()[1] == ("the failure's own words: exited (certain): the training code used CUDA (a device "
                                    "pinned or a tensor moved to it) where this node's torch sees no GPU [no-cuda]")
    assert "raised AttributeError: module 'torch._C' has no attribute '_cuda_setDevice' at train.py:89" in text
    assert "--tee" not in text


@pytest.mark.parametrize("name", sorted(CORPUS_EXPECTED))
def test_each_failure_of_the_explain_corpus_gets_its_exact_verdict(name):
    _, d = verdict(CORPUS / name)
    assert (d.kind, list(d.culprits), list(d.candidates), d.reason, d.certainty) == CORPUS_EXPECTED[name]


def test_the_root_is_quoted_with_file_and_line_and_the_victims_are_evidence():
    e, d = verdict(LOGS / "raise")
    master = str(LOGS / "raise" / "master.log")
    assert [str(q) for q in e.quotes] == [
        f"{master}:20: [default1]:[rank1]: RuntimeError: bad batch at step 5",
        f'{master}:18: [default1]:[rank1]:   File "/work/main/examples/hang_train.py", line 134, in main']
    assert summary(d).startswith("rank 1 on master raised RuntimeError: bad batch at step 5 at hang_train.py:134; then "
                                "rank 0 (lost its peer)")
    assert [(ev.rank, ev.reason) for ev in d.evidence] == [(0, Reason.LOST_PEER), (1, Reason.RAISED),
                                                           (2, Reason.LOST_PEER), (3, Reason.LOST_PEER)]


def test_the_address_family_names_the_odd_node_and_preflights_fix():
    e, d = verdict(LOGS / "vpn-ipv6")
    assert summary(d).startswith("ranks 2,3 cannot connect to their peers: Gloo binds IPv6 on worker1 while its peer "
                                "binds IPv4")
    assert e.fix is not None and e.fix.text() == "export GLOO_SOCKET_IFNAME=<the LAN interface>   # on worker1"
    assert str(e.quotes[0]).startswith(f"{LOGS / 'vpn-ipv6' / 'worker1.log'}:26: [default0]:RuntimeError: [enforce "
                                       "fail at")


def test_the_address_familys_fix_for_a_launched_run_is_the_flag_that_reaches_it(tmp_path):
    # The same node logs in a --launch log folder (its plan.json, here the launch-leave run's, same
    # nodes): an export would never reach the next launched run; --env NODE:NAME=VALUE does.
    for log in ("master.log", "worker1.log"):
        shutil.copy(LOGS / "vpn-ipv6" / log, tmp_path / log)
    shutil.copy(CORPUS / "launch-leave" / "plan.json", tmp_path / "plan.json")
    e, d = verdict(tmp_path)
    assert (list(d.culprits), d.reason) == ([2, 3], Reason.ADDRESS_FAMILY)
    assert e.fix is not None and e.fix.text() == "--env worker1:GLOO_SOCKET_IFNAME=<the LAN interface>"


def test_a_refused_connection_says_which_node_must_accept_from_which():
    _, d = verdict(CORPUS / "refused")
    assert d.unknown_why == ("Gloo's connectFullMesh failed on rank 1 (master): Connection refused connecting to "
                             "10.213.3.11:28050: 10.213.3.11 must accept new TCP connections from master on its "
                             "ephemeral ports")


def test_the_busy_master_port_and_torchruns_parser_get_preflights_fixes():
    e, d = verdict(CORPUS / "port-busy")
    assert (list(d.nodes), d.store) == (["master"], "29533")
    assert e.fix is not None and e.fix.text() == "sudo ss -ltnp 'sport = :29533'   # on master, to see who; or use --master-port"
    e, d = verdict(CORPUS / "swallowed")
    assert e.fix is not None and e.fix.text() == "put the script's options after --: torchrun ... SCRIPT -- --run=test-cpu-ddp"
    assert summary(d) == ("torchrun on master, worker1 took the script's options for its own and stopped before any "
                         "rank started: ambiguous option: --run=test-cpu-ddp could match --run-path, --run_path")


def test_get_future_gets_the_seeds_shim():
    e, _ = verdict(CORPUS / "getfuture")
    assert e.fix is not None and e.fix.text().startswith("call it as _async_op(dist.<the collective>(..., async_op=True)): "
                                                  "a shim that returns work.get_future()")


def test_nccl_duplicate_gpu_names_the_extra_rank():
    _, d = verdict(LOGS / "nccl-h100" / "two-ranks-one-gpu.log")
    assert (d.kind, list(d.culprits), d.reason) == (Kind.EXITED, [1], Reason.NCCL_ERROR)


def test_the_nccl_watchdog_names_the_collective_and_its_sequence_number():
    _, d = verdict(LOGS / "nccl-h100" / "hung-train-tail.log")
    assert (d.kind, list(d.culprits), d.reason) == (Kind.NETWORK_STALL, [0], Reason.TIMED_OUT)
    rank0 = d.evidence[0]
    assert (rank0.seq, rank0.seq_op, rank0.completed) == (65, "all_reduce", 64)
    assert summary(d).startswith("rank 0 waited in all_reduce #65 past the process group's timeout")


def test_a_silent_hang_without_its_flight_recorder_is_no_verdict_rather_than_a_wrong_rank():
    # Raw torchrun output of a rank out of batches, stopped: nothing in it names anyone.
    assert explain([str(CORPUS / "uneven")]).diagnosis is None
    assert explain([str(LOGS / "mismatch")]).diagnosis is None


def test_a_path_that_is_not_there_is_one_line_and_exit_2(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        explain([str(tmp_path / "nothing")])
    run = subprocess.run([sys.executable, "-m", "ddp_preflight.cli.ddp_preflight", "explain", str(tmp_path / "nothing")],
                         capture_output=True, text=True, cwd=Path(__file__).parents[2])
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [f"ddp-preflight explain: error: {tmp_path / 'nothing'} does not exist: "
                                               "give a run's log folder, a log file, an error file, a Flight Recorder "
                                               "dump, an incident bundle, or - for stdin"]


def test_stdin_json_and_exit_codes():
    root = Path(__file__).parents[2]
    log = (LOGS / "sigkill" / "worker1.log").read_bytes()
    run = subprocess.run([sys.executable, "-m", "ddp_preflight.cli.ddp_preflight", "explain", "-", "--json"], input=log,
                         capture_output=True, cwd=root)
    assert run.returncode == 1
    data = json.loads(run.stdout)
    assert (data["ok"], data["diagnosis"]["kind"], data["diagnosis"]["culprits"], data["diagnosis"]["reason"]) == \
        (False, "exited", [3], "killed")
    clean = subprocess.run([sys.executable, "-m", "ddp_preflight.cli.ddp_preflight", "explain", "-"], input=b"step 1 loss 2.0\n",
                           capture_output=True, cwd=root)
    assert clean.returncode == 0 and clean.stdout.startswith(b"no failure found")


def test_a_launch_folder_joins_the_ranks_flight_recorders_by_sequence_number():
    # A real --launch of a rank that leaves the loop at step 6, stopped by --stop-on-hang: every
    # rank's Flight Recorder kept, and hangwatch's bundle with where each rank was.
    e, d = verdict(CORPUS / "launch-leave")
    assert (d.kind, list(d.culprits), list(d.candidates), d.reason, d.certainty) == \
        (Kind.DEADLOCK, [2], [], Reason.BEHIND, Certainty.CERTAIN)
    assert summary(d) == ("rank 2 never entered all_reduce #12 (its last: #11 all_reduce; it was at hang_train.py:212), "
                         "which ranks 0,1,3 issued at hang_train.py:140")
    assert str(e.quotes[0]) == f"{CORPUS / 'launch-leave' / 'flight-rank-2.json'}: rank 2: collective #11 all_reduce scheduled"
    # The dumps alone name the same rank, without the lines only the live watcher saw.
    _, alone = verdict(*sorted((CORPUS / "launch-leave").glob("flight-rank-*.json")))
    assert (alone.kind, list(alone.culprits), alone.reason) == (Kind.DEADLOCK, [2], Reason.BEHIND)
    assert summary(alone) == "rank 2 never entered all_reduce #12 (its last: #11 all_reduce), which ranks 0,1,3 issued"


def test_a_launch_whose_node_never_started_is_that_node_and_its_fix_not_no_failure():
    # Issue 26: "no failure found" (exit 0) of a launch whose node failed to start. Recorded: worker1's
    # Python has no torch, --force launched anyway; the master's torchrun was stopped in its rendezvous.
    folder = CORPUS / "node-not-started"
    e = explain([str(folder)])
    said = "torchrun is not importable with /usr/bin/python3: No module named 'torch'"
    assert e.diagnosis is None and e.finding is not None and not e.ok
    f = e.finding
    assert (f.kind.value, f.cause.value, f.culprits, f.sure.value) == ("node-not-started", "node-error", (), "certain")
    assert f.detail == {"nodes": {"worker1": said}}
    assert e.fix is not None and e.fix.text() == ("/usr/bin/python3 -m pip install torch==2.13.0 --index-url "
                                                  "https://download.pytorch.org/whl/cpu, or --python the training "
                                                  "environment's interpreter")
    assert [str(q) for q in e.quotes] == [f"{folder / 'result.json'}: worker1: error: {said}"]


def test_uneven_data_gets_the_standard_remedies_from_the_one_catalogue_hangwatch_uses():
    from ddp_preflight.hangwatch.causes import CAUSES, UNEVEN_DATA
    from ddp_preflight.hangwatch.words import cause_line
    for words in ("equal shards", "drop_last=True", "Join context manager", "one all_reduce per step"):
        assert words in cause_line(UNEVEN_DATA)          # causes are data now: their fixes are Fix values
    behind = CAUSES[Reason.BEHIND][0]
    assert UNEVEN_DATA in CAUSES[Reason.LEFT_LOOP] and UNEVEN_DATA.what in behind.what and \
        UNEVEN_DATA.fixes == behind.fixes
    _, d = verdict(CORPUS / "launch-leave")
    assert list(d.causes) == list(CAUSES[Reason.BEHIND])


def test_a_rendezvous_timeout_names_the_node_that_cannot_reach_the_store_and_the_store_alone_is_unsure():
    _, d = verdict(CORPUS / "rendezvous-timeout")
    assert (list(d.nodes), d.store) == (["worker1"], "10.213.3.200:29534")
    _, d = verdict(CORPUS / "rendezvous-timeout" / "master.log")
    assert (d.kind, d.reason, d.certainty, list(d.culprits)) == \
        (Kind.RENDEZVOUS_STALL, Reason.NEVER_CHECKED_IN, Certainty.UNSURE, [])
    assert summary(d) == ("torchrun on master waited for nodes that never joined its rendezvous: the store waited 11 s "
                         "and 1 of 2 torchruns joined")


def test_the_error_file_a_launched_rank_leaves_is_read_as_its_own_record(tmp_path):
    # rank_bootstrap.py writes torchelastic's error file for a script that raises (no @record).
    script = tmp_path / "train.py"
    script.write_text("def step(n):\n    raise ValueError(f'bad shard {n}')\n\nstep(7)\n")
    error = tmp_path / "error-rank-5.json"
    bootstrap = Path(__file__).parents[2] / "ddp_preflight" / "node" / "rank_bootstrap.py"
    run = subprocess.run([sys.executable, str(bootstrap), str(script)], capture_output=True, text=True,
                         env={"TORCHELASTIC_ERROR_FILE": str(error), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 1 and "ValueError: bad shard 7" in run.stderr
    assert json.loads(error.read_text())["message"]["message"] == "ValueError: bad shard 7"
    _, d = verdict(error)
    assert (d.kind, list(d.culprits), d.reason) == (Kind.EXITED, [5], Reason.RAISED)
    seen = d.evidence[0].exception
    assert seen is not None and (seen.type, seen.message, seen.where, seen.source) == \
        ("ValueError", "bad shard 7", "train.py:2", "record")
