"""A stop's own words are a consequence, never a root (issue 35): a rank that raised KeyboardInterrupt
(Ctrl-C to its process group, torchrun's SIGINT to its workers) or torch elastic's SignalException
(a scheduler's or a launcher's SIGTERM turned into an exception) was stopped; the one judge
(hangwatch/exits.py) reads that as it reads the stop signal itself. Its records are written by
node/rank_bootstrap.py's own record_ending, here, from the exceptions really raised."""

from __future__ import annotations

import json
import os
import signal

import pytest

from ddp_preflight.hangwatch.text import summary
from ddp_preflight.node.rank_bootstrap import ENDING, record_ending

from .test_hangwatch_exits import _exits, _said


def _record(tmp_path, raise_it) -> dict:
    """The PID.end record of an exception raised here (a real KeyboardInterrupt from SIGINT)."""
    folder = tmp_path / "ends"
    folder.mkdir(exist_ok=True)
    try:
        raise_it()
    except BaseException as exc:       # noqa: BLE001 (KeyboardInterrupt is what is recorded)
        record_ending(str(folder), "raised", exc)
    path = folder / (ENDING % os.getpid())
    record = json.loads(path.read_text())
    path.unlink()
    return record


def _interrupted() -> None:
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)


class SignalException(Exception):
    """torch.distributed.elastic.multiprocessing.api.SignalException's name and words (torch 1.9+)."""


def _terminated() -> None:
    raise SignalException(f"Process {os.getpid()} got signal: 15")


@pytest.mark.parametrize("raise_it, status", [(_interrupted, 2), (_terminated, 256)])
def test_a_run_whose_ranks_raised_a_stops_own_exception_was_stopped_not_failed(tmp_path, raise_it, status):
    # Before: "ranks 0,1,2,3 raised KeyboardInterrupt" (certain): four culprits for one Ctrl-C.
    record = _record(tmp_path, raise_it)
    exits = [("master", 100, 10.00, status, {"ending": {**record, "t": 10.00}}),
             ("master", 101, 10.01, status, {"ending": {**record, "t": 10.01}}),
             ("worker1", 102, 10.02, status, {"ending": {**record, "t": 10.02}}),
             ("worker1", 103, 10.03, status, {"ending": {**record, "t": 10.03}})]
    assert _exits(tmp_path, exits) == []


def test_a_rank_that_failed_before_the_stop_is_named_and_the_stopped_ones_are_not(tmp_path):
    # Rank 3 raised its own error; a person then pressed Ctrl-C: ranks 0,1,2 raised KeyboardInterrupt.
    stop = _record(tmp_path, _interrupted)
    own = _record(tmp_path, lambda: (_ for _ in ()).throw(ValueError("bad batch")))
    exits = [("worker1", 103, 9.00, 256, {"ending": {**own, "t": 9.00}}),
             ("master", 100, 10.00, 2, {"ending": {**stop, "t": 10.00}}),
             ("master", 101, 10.01, 2, {"ending": {**stop, "t": 10.01}}),
             ("worker1", 102, 10.02, 2, {"ending": {**stop, "t": 10.02}})]
    found = _exits(tmp_path, exits)
    assert _said(found) == ("exited", [3], [], "raised", "certain"), summary(found[0])
    # torchrun stopping rank 3's sibling after it failed: the sibling's KeyboardInterrupt is that stop's.
    sibling = _exits(tmp_path, exits[:1] + [("worker1", 102, 9.40, 2, {"ending": {**stop, "t": 9.40}})])
    assert _said(sibling) == ("exited", [3], [], "raised", "certain"), summary(sibling[0])
    evidence = {e.rank: e.reason for e in sibling[0].evidence}
    assert evidence[2] == "stopped-by-launcher"
