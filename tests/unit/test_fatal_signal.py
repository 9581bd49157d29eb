"""A rank that a fatal signal ends (a SIGSEGV in native code) names its Python line: under --launch
the bootstrap turns on faulthandler into the rank's Flight Recorder folder (node/rank_bootstrap.py),
the real agent sends what it wrote as the rank's record (node/flight.py's ending), and the verdict
on its end quotes the line (hangwatch/ended.py's crashed_at, exits.judge, ended_text)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from ddp_preflight.hangwatch import exits
from ddp_preflight.hangwatch.ended import crashed_at
from ddp_preflight.hangwatch.ended_text import exit_head
from ddp_preflight.node.protocol import ExitStatus

from .test_agent_evidence import _agent, _bootstrapped, _end, _exit_of, _sampled

CRASH = """
import ctypes


def read_the_batch():
    return ctypes.string_at(0)      # line 11 of the script: a read of address 0 (SIGSEGV)


read_the_batch()
"""


def test_a_segfault_under_the_bootstrap_names_the_scripts_line_in_the_verdict(tmp_path: Path):
    folder = tmp_path / "fr"
    folder.mkdir(mode=0o700)
    rank = _bootstrapped(tmp_path, CRASH, folder)
    messages: list = []
    a = _agent([rank.pid], messages)
    try:
        _sampled(messages, rank.pid, 2)
        (tmp_path / "go").touch()
        said = _exit_of(messages, rank.pid)
        assert ExitStatus.from_wait_status(said.code) == ExitStatus(signal=signal.SIGSEGV)
        record = said.ending
        # innermost last: ctypes' string_at, then the script's own line
        assert (record["how"], record["error"], record["frames"][-2]) == \
            ("fatal", "Segmentation fault", {"file": str(tmp_path / "train.py"), "line": 11,
                                             "function": "read_the_batch"}), record
        assert record["frames"][-1]["function"] == "string_at"
        assert not (folder / f"{rank.pid}.fatal").exists()         # read once: a pid is reused
    finally:
        a.stop.set()
        _end(rank)
    frame, function = crashed_at(record)
    assert (frame, function) == ("train.py:11", "read_the_batch")
    found = exits.judge([exits.Ending("master", rank.pid, 0, status=ExitStatus(signal=signal.SIGSEGV), record=record,
                                      frame=frame, function=function)])
    assert found is not None and (found.culprits, found.reason) == ((0,), "killed")
    assert exit_head(found) == "rank 0 on master was killed (signal 11, SIGSEGV) at train.py:11 (read_the_batch)"


def test_a_rank_that_ends_normally_leaves_no_fatal_record(tmp_path: Path):
    folder = tmp_path / "fr"
    folder.mkdir(mode=0o700)
    rank = _bootstrapped(tmp_path, "print('done')\n", folder)
    messages: list = []
    a = _agent([rank.pid], messages)
    try:
        _sampled(messages, rank.pid, 2)
        # faulthandler's file, while it runs: the bootstrap makes it before the script's first line
        # (the script waits for "go"), however long a loaded machine takes to get there.
        fatal = folder / f"{rank.pid}.fatal"
        deadline = time.monotonic() + 60
        while not fatal.exists() and rank.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fatal.exists()
        (tmp_path / "go").touch()
        said = _exit_of(messages, rank.pid)
        assert said.code == 0 and said.ending["how"] == "returned", said.ending
        assert not (folder / f"{rank.pid}.fatal").exists()
    finally:
        a.stop.set()
        _end(rank)
