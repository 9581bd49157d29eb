"""Each family a round of pasted logs (the corpus's 227-301) taught explain, tried on variants nobody
pasted (other ranks, signals, wordings, prefixes): the rule decides the family from what its lines
say, not from one recorded line. Every answer is asserted whole: (kind, culprits, certainty, cause)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_preflight.explain import explain


def answer(tmp_path: Path, text: str) -> tuple | None:
    path = tmp_path / "paste.log"
    path.write_text(text)
    f = explain([str(path)]).finding
    return None if f is None else (f.kind.value, list(f.culprits), f.sure.value, f.cause.value)


SPAWN_RAISED = """Traceback (most recent call last):
  File "train.py", line 9, in <module>
    mp.spawn(run, nprocs=4)
torch.multiprocessing.spawn.ProcessRaisedException:

-- Process {index} terminated with the following error:
Traceback (most recent call last):
  File "/opt/conda/lib/python3.10/site-packages/torch/multiprocessing/spawn.py", line 69, in _wrap
    fn(i, *args)
  File "train.py", line 40, in run
    batch = next(it)
{error}
"""


@pytest.mark.parametrize("index,error", [(2, "KeyError: 'label'"), (0, "ValueError: bad shape"),
                                         (3, "AssertionError")])
def test_mp_spawn_names_the_process_whose_exception_follows_its_header(tmp_path, index, error):
    # the index is mp.spawn's: a local rank, taken as the rank on what is one node (likely)
    assert answer(tmp_path, SPAWN_RAISED.format(index=index, error=error)) == \
        ("exited", [index], "likely", "python-exception")


def test_a_prefixed_rank_own_traceback_stays_certain(tmp_path):
    text = ("[rank1]: Traceback (most recent call last):\n[rank1]:   File \"train.py\", line 3, in <module>\n"
            "[rank1]: KeyError: 'x'\nE0101 00:00:00.000000 1 api.py:869] failed (exitcode: 1) local_rank: 1 (pid: 7)\n")
    assert answer(tmp_path, text) == ("exited", [1], "certain", "python-exception")


LAUNCH = """Traceback (most recent call last):
  File "/usr/lib/python3.8/runpy.py", line 85, in _run_code
    exec(code, run_globals)
  File "/usr/lib/python3.8/site-packages/torch/distributed/launch.py", line 246, in <module>
    main()
  File "/usr/lib/python3.8/site-packages/torch/distributed/launch.py", line 242, in main
    cmd=cmd)
subprocess.CalledProcessError: Command {command} {ending}
"""


@pytest.mark.parametrize("ending,kind,cause", [
    ("died with <Signals.SIGSEGV: 11>.", "crashed-segv-abort", "segfault"),
    ("died with <Signals.SIGABRT: 6>.", "crashed-segv-abort", "abort"),
    ("died with <Signals.SIGKILL: 9>.", "signal-killed", "sigkill-oom-or-scheduler"),
    ("returned non-zero exit status 1.", "exited", "unknown"),
])
def test_the_old_launchs_error_however_its_command_was_shown(tmp_path, ending, kind, cause):
    assert answer(tmp_path, LAUNCH.format(command="'[...]' (elided)", ending=ending)) == (kind, [], "likely", cause)


def test_a_calledprocesserror_of_no_launcher_is_no_rank_s_end(tmp_path):
    text = LAUNCH.replace("torch/distributed/launch.py", "tools/prepare.py").format(
        command="'['make', 'data']'", ending="returned non-zero exit status 2.")
    assert answer(tmp_path, text) == ("exited", [], "certain", "python-exception")


@pytest.mark.parametrize("host", ["node-7", "10.0.0.12", "gpu01.cluster.local"])
def test_a_launcher_that_could_not_ssh_to_a_node_started_nothing_there(tmp_path, host):
    text = (f"subprocess.CalledProcessError: Command 'ssh -o PasswordAuthentication=no {host} hostname' returned "
            "non-zero exit status 255.\n")
    assert answer(tmp_path, text) == ("node-not-started", [], "certain", "node-error")
    data = explain([str(tmp_path / "paste.log")])
    assert data.finding is not None and data.finding.fix is not None
    assert data.finding.fix.text().startswith(f"ssh -o BatchMode=yes {host} hostname")


def test_a_host_that_is_no_name_never_goes_into_the_fix(tmp_path):
    (tmp_path / "paste.log").write_text("RuntimeError: Using hostfile at /h but host=$(touch${IFS}x) was not reachable "
                                        "via ssh.\n")
    f = explain([str(tmp_path / "paste.log")]).finding
    assert f is not None and f.fix is not None and f.fix.text().startswith("ssh -o BatchMode=yes HOST hostname")


@pytest.mark.parametrize("line,culprits", [
    # the default group's ranks are the global ones; another group's are not
    ("[3] is setting up NCCL communicator and retrieving ncclUniqueId from [2] via c10d key-value store by key '0', "
     "but store->get('0') got error: wait timeout after 600000ms, keys: /default_pg/0//cuda//0", [2]),
    ("[1] is setting up NCCL communicator and retreiving ncclUniqueId from [0] via c10d key-value store by key '0', "
     "but store->get('0') got error: Timeout waiting for key: default_pg/0/0 after 1800000 ms", [0]),
    ("[1] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d key-value store by key '0', "
     "but store->get('0') got error: wait timeout after 600000ms, keys: /4/0//cuda//0", []),
])
def test_a_wait_for_a_groups_nccl_id_names_the_rank_that_never_came(tmp_path, line, culprits):
    assert answer(tmp_path, f"torch.distributed.DistBackendError: {line}\n") == \
        ("rank-behind", culprits, "likely", "rank-behind-same-group")


@pytest.mark.parametrize("signal_line,cause", [
    ("SIGSEGV(11), PID: 812, Thread 812: ", "segfault"),
    ("SIGBUS(7), PID: 812, Thread 830: ", "bus-error"),
    ("SIGABRT(6), PID: 812, Thread 812: ", "abort"),
])
def test_c10s_fatal_signal_handler_names_the_signal(tmp_path, signal_line, cause):
    text = f"{signal_line}\n frame #0: c10::FatalSignalHandler::stacktraceSignalHandler(bool) + 0x5f (0x1 in libc10.so)\n"
    assert answer(tmp_path, text) == ("crashed-segv-abort", [], "likely", cause)


@pytest.mark.parametrize("table_code,line_code", [(-7, -7)])
def test_sigbus_is_a_crash_certain_in_the_table_likely_on_the_failed_line(tmp_path, table_code, line_code):
    table = ("Root Cause (first observed failure):\n[0]:\n  time      : 2024-01-01_00:00:00\n  host      : n1\n"
             f"  rank      : 5 (local_rank: 1)\n  exitcode  : {table_code} (pid: 9)\n  error_file: <N/A>\n"
             "  traceback : Signal 7 (SIGBUS) received by PID 9\n")
    assert answer(tmp_path, table) == ("crashed-segv-abort", [5], "certain", "bus-error")
    line = f"ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: {line_code}) local_rank: 2 (pid: 9)\n"
    assert answer(tmp_path, line) == ("crashed-segv-abort", [2], "likely", "bus-error")


@pytest.mark.parametrize("stop", [
    "W0101 00:00:00.000000 1 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 41 closing signal SIGTERM",
    "W0101 00:00:00.000000 1 torch/distributed/elastic/multiprocessing/api.py:766] Closing process 41 via signal SIGTERM",
    "W0101 00:00:00.000000 1 torch/multiprocessing/spawn.py:169] Terminating process 41 via signal SIGTERM",
])
def test_a_launcher_stopping_ranks_is_never_a_root(tmp_path, stop):
    assert answer(tmp_path, stop + "\n") == ("exited", [], "unknown", "unknown")
    failed = "E0101 00:00:01.000000 1 api.py:869] failed (exitcode: -9) local_rank: 3 (pid: 40) of binary: python\n"
    assert answer(tmp_path, stop + "\n" + failed) == ("signal-killed", [3], "likely", "sigkill-oom-or-scheduler")


# a Ctrl-C (SIGINT) is a person stopping a stuck run; a SIGTERM is a sender outside the run, and says it ended,
# not that it hung (issue 37: a scheduler's SIGTERM was read as a Ctrl-C and given the Flight Recorder's fix)
@pytest.mark.parametrize("death,said", [
    ("Received Signals.SIGTERM death signal", ("exited", [], "unknown", "unknown")),
    ("Received Signals.SIGINT death signal", ("timeout-unknown-root", [], "unknown", "unknown-collect-flight-recorder")),
    ("Received 15 death signal", ("exited", [], "unknown", "unknown"))])
def test_the_agent_stopped_from_outside_is_never_a_root(tmp_path, death, said):
    text = f"W0101 00:00:00.000000 1 torch/distributed/elastic/agent/server/api.py:688] {death}, shutting down workers\n"
    assert answer(tmp_path, text) == said


def test_nccls_system_error_over_an_ib_completion_error_is_the_ib_error(tmp_path):
    text = ("n1:1:2 [0] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<5000> with "
            "error 12, opcode 0, len 0, vendor err 129\n"
            "RuntimeError: NCCL error in: /x/ProcessGroupNCCL.cpp:1269, unhandled system error, NCCL version 2.18.1\n")
    assert answer(tmp_path, text) == ("nccl-error", [], "likely", "nccl-ib-completion-error")
    alone = "RuntimeError: NCCL error in: /x/ProcessGroupNCCL.cpp:1269, unhandled system error, NCCL version 2.18.1\n"
    assert answer(tmp_path, alone) == ("nccl-error", [], "certain", "nccl-system-error")


@pytest.mark.parametrize("line,cause", [
    ("RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:83] ifa != nullptr. Unable to "
     "find address for: eth1", "gloo-interface-missing"),
    ("RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:127] rp != nullptr. Unable to "
     "find address for: worker-3", "gloo-hostname-unresolvable"),
])
def test_gloos_two_lookups_are_told_apart_by_what_failed(tmp_path, line, cause):
    assert answer(tmp_path, line + "\n") == ("gloo-address", [], "certain", cause)
