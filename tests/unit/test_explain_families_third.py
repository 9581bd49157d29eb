"""Each family the corpus's 302-335 taught explain, tried on variants nobody pasted (other ranks,
codes, signals, prefixes, where the paste was cut): torchrun's table read by its sections and its
seconds, mp.spawn's line cut short, NCCL's result codes and CUDA failures in its own lines, the store
barrier's line without its counts, a DataLoader worker's own word on its crash. Every answer is
asserted whole: (kind, culprits, certainty, cause), and the fix where the family is about it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_preflight.explain import explain
from ddp_preflight.explain.render import as_json

ROOT = Path(__file__).parents[2]


def answer(tmp_path: Path, text: str) -> tuple | None:
    path = tmp_path / "paste.log"
    path.write_text(text)
    f = explain([str(path)]).finding
    return None if f is None else (f.kind.value, list(f.culprits), f.sure.value, f.cause.value)


def fix(tmp_path: Path, text: str) -> str | None:
    path = tmp_path / "paste.log"
    path.write_text(text)
    return json.loads(as_json(explain([str(path)])))["fix"]


HEAD = """    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
"""


def entry(index: int, time: str, rank: int, local: int, code: int | None) -> str:
    lines = [f"[{index}]:", f"  time      : 2025-03-01_{time}", "  host      : node-a",
             f"  rank      : {rank} (local_rank: {local})"]
    if code is not None:
        lines.append(f"  exitcode  : {code} (pid: {1000 + rank})")
        lines.append("  error_file: <N/A>")
        lines.append(f"  traceback : Signal {-code} (SIG{ {9: 'KILL', 11: 'SEGV', 15: 'TERM'}[-code] }) received by "
                     f"PID {1000 + rank}" if code < 0 else "  traceback : To enable traceback see: "
                     "https://pytorch.org/docs/stable/elastic/errors.html")
    return "\n".join(lines) + "\n"


def table(failures: list[str], root: str | None) -> str:
    text = HEAD + "Failures:\n" + ("".join(failures) if failures else "  <NO_OTHER_FAILURES>\n")
    if root is not None:
        text += "------------------------------------------------------------\nRoot Cause (first observed failure):\n" + root
    return text


@pytest.mark.parametrize("failures", [
    [entry(1, "10:00:05", 3, 3, 1)],
    [entry(1, "10:00:05", 6, 2, -9), entry(2, "10:00:07", 4, 0, 1)],
    [entry(1, "10:00:05", 1, 1, -11)],
    [entry(1, "10:00:05", 2, 2, None)],              # cut inside its first entry
])
def test_ranks_listed_under_failures_are_never_the_first_failure(tmp_path, failures):
    # torchrun puts the first failure under "Root Cause": without it, the paste does not say who
    text = table(failures, None)
    assert answer(tmp_path, text) == ("exited", [], "unknown", "unknown")
    assert fix(tmp_path, text).startswith("grep -n -A8 'Root Cause (first observed failure)'")


def test_a_table_cut_before_any_entry_is_a_failure_of_no_named_rank(tmp_path):
    assert answer(tmp_path, table([], None)) == ("exited", [], "unknown", "unknown")
    assert answer(tmp_path, HEAD) == ("exited", [], "unknown", "unknown")


@pytest.mark.parametrize("failures,root,want", [
    # the root's second holds another failure: either may have ended first (torchrun dates to the second)
    ([entry(1, "10:00:05", 3, 3, 1), entry(2, "10:00:40", 0, 0, -9)], entry(0, "10:00:05", 1, 1, 1),
     ("exited", [], "unknown", "unknown")),
    ([entry(1, "10:00:05", 5, 5, -9)], entry(0, "10:00:05", 2, 2, None),       # the root's code cut
     ("signal-killed", [], "unknown", "sigkill-oom-or-scheduler")),
    ([entry(1, "10:00:05", 3, 3, 1), entry(2, "10:00:09", 1, 1, -9)], entry(0, "10:00:05", 0, 0, -11),
     ("crashed-segv-abort", [], "unknown", "segfault")),
    # alone in its second: the root is the first failure (torchrun's SIGTERMs of the others are victims)
    ([entry(1, "10:00:35", 1, 1, -9), entry(2, "10:00:35", 0, 0, -15)], entry(0, "10:00:05", 2, 2, -11),
     ("crashed-segv-abort", [2], "certain", "segfault")),
    ([entry(1, "10:00:35", 3, 3, 1)], entry(0, "10:00:05", 1, 1, None),        # the root's code cut
     ("exited", [1], "likely", "unknown")),
])
def test_the_root_is_named_only_when_no_other_failure_shares_its_second(tmp_path, failures, root, want):
    assert answer(tmp_path, table(failures, root)) == want


@pytest.mark.parametrize("line,want", [
    ("torch.multiprocessing.spawn.ProcessExitedException: process 5 terminated with", 5),
    ("torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated with  ", 0),
])
def test_mp_spawns_line_cut_after_terminated_with_still_names_its_process(tmp_path, line, want):
    text = ("W0124 03:42:15.485000 1 torch/multiprocessing/spawn.py:146] Terminating process 815353 via signal SIGTERM\n"
            '  File "/opt/lib/python3.11/site-packages/torch/multiprocessing/spawn.py", line 170, in join\n'
            "    raise ProcessExitedException(\n" + line + "\n")
    assert answer(tmp_path, text) == ("exited", [want], "likely", "unknown")
    assert fix(tmp_path, text).startswith("grep -n 'Traceback\\|Error\\|terminated with'")


def test_mp_spawn_gets_its_own_fix_never_torchruns(tmp_path):
    text = ("torch.multiprocessing.spawn.ProcessRaisedException:\n\n-- Process 2 terminated with the following error:\n"
            "Traceback (most recent call last):\n"
            '  File "/usr/lib/python3.8/site-packages/torch/multiprocessing/spawn.py", line 59, in _wrap\n'
            "    fn(i, *args)\n")
    assert answer(tmp_path, text) == ("exited", [2], "likely", "unknown")
    assert "torchrun" not in fix(tmp_path, text)


NCCL_TRACE = """gpu07:4410:4471 [{dev}] NCCL INFO transport/net.cc:728 -> {code}
gpu07:4410:4471 [{dev}] NCCL INFO proxy.cc:1306 -> {code}
gpu07:4410:4471 [{dev}] NCCL INFO init.cc:1358 -> {code}
"""


@pytest.mark.parametrize("code,cause", [(3, "unknown"), (4, "unknown"), (5, "nccl-invalid-usage"),
                                        (6, "nccl-remote-peer-gone"), (1, "nccl-cuda-failure"),
                                        (2, "nccl-system-error")])
def test_the_code_nccl_returned_up_its_stack_says_its_cause(tmp_path, code, cause):
    assert answer(tmp_path, NCCL_TRACE.format(dev=1, code=code)) == ("nccl-error", [], "likely", cause)


@pytest.mark.parametrize("line,cause", [
    ("node1:9:9 [0] proxy.cc:1519 NCCL WARN [Proxy Service 4] Failed to execute operation Connect from rank 4, "
     "retcode 3", "unknown"),
    ("node1:9:9 [0] proxy.cc:1485 NCCL WARN [Service thread] Error encountered progressing operation=Connect, res=6, "
     "closing connection", "nccl-remote-peer-gone"),
    ("Tue Jan 2 10:00:00 2024[1,7]<stdout>:node1:9:9 [7] transport.cc:154 NCCL WARN Cuda failure 'initialization error'",
     "nccl-cuda-failure"),
    ("[rank3]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error "
     "(run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5", "nccl-cuda-failure"),
])
def test_nccls_own_warn_line_is_a_failure_whatever_its_prefix(tmp_path, line, cause):
    assert answer(tmp_path, line + "\n") == ("nccl-error", [], "likely", cause)


def test_a_cuda_failure_out_of_memory_stays_an_out_of_memory(tmp_path):
    text = "node1:9:9 [2] include/alloc.h:103 NCCL WARN Cuda failure 2 'out of memory'\n"
    assert answer(tmp_path, text) == ("oom-cuda", [], "likely", "cuda-oom")


def test_nccls_setup_lines_alone_are_no_failure(tmp_path):
    text = ("node0:13571:13571 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0\n"
            "node0:13571:13571 [0] NCCL INFO Connected all rings\n"
            "node0:13571:13571 [0] NCCL INFO threadThresholds 8/8/64 | 32/8/64 | 512 | 512\n")
    assert answer(tmp_path, text) is None


@pytest.mark.parametrize("line,cause", [
    ("RuntimeError: Timed out initializing process group in store based barrier on rank: 3", "unknown"),
    ("Timed out initializing process group in store based barrier on rank 5 (all ranks)", "unknown"),
    ("RuntimeError: Timed out initializing process group in store based barrier on rank: 1, for key: "
     "store_based_barrier_key:1 (world_size=8, worker_count=6, timeout=0:30:00)", "ranks-never-joined"),
    ("Timed out initializing process group in store based barrier on rank: 0, for key: store_based_barrier_key:2 "
     "(world_size=2, worker_count=3, timeout=0:10:00)", "extra-processes-joined"),
])
def test_the_store_barriers_timeout_without_its_counts_says_no_cause(tmp_path, line, cause):
    assert answer(tmp_path, line + "\n") == ("store-timeout", [], "likely", cause)
    if cause == "unknown":         # what decides it is collected, not a fix for a cause not seen
        assert fix(tmp_path, line + "\n").startswith("grep -n 'store based barrier'")


@pytest.mark.parametrize("text,cause", [
    ("ERROR: Unexpected segmentation fault encountered in worker.\n", "segfault"),
    ("[rank2]: ERROR: Unexpected segmentation fault encountered in worker.\n Traceback (most recent call last):\n",
     "segfault"),
    ("ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).\n",
     "shared-memory-too-small"),
])
def test_a_dataloader_workers_own_word_on_its_crash(tmp_path, text, cause):
    assert answer(tmp_path, text) == ("crashed-segv-abort", [], "certain", cause)


def test_exit_codes_a_healthy_part_0_a_cut_table_1(tmp_path):
    healthy = tmp_path / "ok.log"
    healthy.write_text("node0:1:1 [0] NCCL INFO Connected all rings\n")
    cut = tmp_path / "cut.log"
    cut.write_text(HEAD)
    codes = [subprocess.run([sys.executable, "-m", "ddp_preflight.cli.ddp_preflight", "explain", str(p)],
                            capture_output=True, cwd=ROOT).returncode for p in (healthy, cut)]
    assert codes == [0, 1]


def test_a_line_cut_just_before_a_quote_sign_is_joined_back(tmp_path):
    # a wrap before NCCL's "<49189>" closing sign: the rest starts with ">", which is no markdown quote here
    text = ("node2:251:258 [0] ib_plugin.c:1105 NCCL WARN NET/IB : Got completion from peer 10.0.35.1<49189\n"
            "> with error 4, opcode 5327, len 5327, vendor err 81 (Send)\n")
    assert answer(tmp_path, text) == ("nccl-error", [], "likely", "nccl-ib-completion-error")


def test_lines_a_table_prints_alike_are_no_terminals_wrap(tmp_path):
    # every entry's traceback line is the same line: of one length, yet no wrap joins it to the next entry
    ranks = [entry(1, "10:00:05", 1, 1, 1), entry(2, "10:00:05", 2, 2, 1)]
    path = tmp_path / "paste.log"
    path.write_text(table(ranks, entry(0, "10:00:05", 0, 0, 1)) + "=" * 60 + "\n")
    d = explain([str(path)]).diagnosis
    assert d is not None and sorted(e.rank for e in d.evidence) == [0, 1, 2]
    assert answer(tmp_path, path.read_text()) == ("exited", [], "unknown", "unknown")


def test_an_accelerate_launch_gets_accelerates_own_options_never_torchruns(tmp_path):
    text = ('  File "/usr/lib/python3.10/site-packages/accelerate/commands/launch.py", line 793, in multi_gpu_launcher\n'
            "    distrib_run.run(args)\n" + table([], entry(0, "10:00:05", 0, 0, 1)))
    assert answer(tmp_path, text) == ("exited", [0], "likely", "unknown")
    assert fix(tmp_path, text).startswith("accelerate launch --log_dir LOGS --tee 3 ")
    # the same table under torchrun keeps torchrun's options
    assert fix(tmp_path, table([], entry(0, "10:00:05", 0, 0, 1))).startswith("torchrun --log-dir=LOGS --tee=3")


@pytest.mark.parametrize("text", [
    "[1763]   1%|          | 24/1752 [01:08<1:22:56,  2.88s/it][rank5]:[E602 11:17:52.185053341 "
    "ProcessGroupNCCL.cpp:632] [Rank 5] Watchdog caught collective operati\n",
    "[rank3]:[E0102 10:00:00.000 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective\n",
    "[E ProcessGroupNCCL.cpp:475] [Rank 0] Watchdog caught collective operation time\n",
    "[E ProcessGroupNCCL.cpp:475] [Rank 0] Watchdog caught \n",
    # cut before its WorkNCCL's fields (corpus 362's own wrap, re-wrapped at another width)
    "[rank2]:[E1212 17:21:29.139598465 ProcessGroupNCCL.cpp:1515] [PG 0 (default_pg) Rank 2] Process group watchdog "
    "thread terminated with exception: [Rank 2] Watchdog caught collective operation timeout: Work\n",
    "[Rank 2] Watchdog caught collective operation timeout: WorkNCCL(\n",
    "[Rank 2] Watchdog caught collective operation timeout: \n",
])
def test_a_watchdog_line_cut_inside_its_words_is_still_a_timeout(tmp_path, text):
    assert answer(tmp_path, text) == ("timeout-unknown-root", [], "unknown", "unknown-collect-flight-recorder")


def test_prose_about_the_watchdog_is_no_timeout(tmp_path):
    assert answer(tmp_path, "we saw the Watchdog caught collective operation timeout error happen twice\n") is None


def test_a_watchdog_line_wrapped_at_a_space_is_joined_back_whole():
    from ddp_preflight.explain.paste import lines_of
    text = ("[rank1]:[E1206 10:00:00.000 ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught collective operation\n"
            "timeout: WorkNCCL(SeqNum=6, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600010 "
            "milliseconds before timing out.\n")
    assert [line for _, line in lines_of(text)] == [text.replace("operation\n", "operation ").rstrip("\n")]
