"""The catalogue of how a rank's output says it ended (hangwatch/tracebacks.py), on real logs:
tests/unit/artifacts/logs/ holds the output of real 2-node x 2-rank Gloo runs on the lab (record.py
made them; README.md says how each was made), and two real NCCL recordings from an H100. The
rank's own record (from_record) is made here by really running a script under the bootstrap. Only
the prefix rules and the bounds are tested on lines written here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tracemalloc
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from ddp_preflight.hangwatch.lost_peer import lost_peer
from ddp_preflight.hangwatch.prefixes import Origin, split_prefix, strip_prefix
from ddp_preflight.hangwatch.torchrun_table import first_observed_failure
from ddp_preflight.hangwatch.tracebacks import (
    LINE_CHARS,
    MESSAGE_CHARS,
    MESSAGE_LINES,
    ExceptionKind,
    Reader,
    exception_in,
    exceptions_by_writer,
    from_record,
)
from ddp_preflight.node import rank_bootstrap

from .ports import free_port

LOGS = Path(__file__).parent / "artifacts" / "logs"
BOOTSTRAP = Path(rank_bootstrap.__file__)


def lines_of(name: str) -> list[str]:
    return (LOGS / name).read_text(encoding="utf-8").splitlines(keepends=True)


def tee(local_rank: int) -> Origin:
    return Origin(local_rank=local_rank)


def marked(rank: int) -> Origin:
    return Origin(marker=rank)


def launched(node: str, rank: int) -> Origin:
    return Origin(node=node, rank=rank)


NODE = Origin()        # a node's own lines (torchrun's), and a rank's lines without a prefix

# The messages, as torch 2.13's Gloo writes them.
PAIR = "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:"
CRASHING = ("This is typically caused by a remote worker crashing. Check the logs of the remote worker before reporting an "
            "error. GLHF! 🏖️")
HANGING = ("This is typically caused by a remote worker hanging or bugs in the application. Check the logs of the remote "
           "worker before reporting an error. GLHF! 🏖️")
TIMED_OUT = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:{}] Timed out waiting 8000ms for {} "
             "operation to complete")
CONNECT = ("Gloo connectFullMesh failed with [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.h:311] "
           "Connect timeout [none]")
FAMILY = ("[enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/device.cc:285] "
          "ss1.ss_family == ss2.ss_family. {}")
ENFORCE = ("[enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:456] op.preamble.length <= "
           "op.nbytes. 4096 vs 2048. Received data size doesn't match expected size. Is there a distributed collective "
           "mismatch in your code?")
DUPLICATE = ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:93, invalid usage (run with NCCL_DEBUG=WARN "
             "for details), NCCL version 2.28.9\nncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n"
             "Last error:\nDuplicate GPU detected : rank {} and rank {} both on CUDA device 60")
WATCHDOG = ("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=65, OpType=ALLREDUCE, NumelIn=16781312, "
            "NumelOut=16781312, Timeout(ms)=60000) ran for 60022 milliseconds before timing out.")
NO_EXCEPTION = "terminate called without an active exception"
SITE = "/work/main/.venv/lib/python3.11/site-packages/torch/utils/data/_utils/"
WORKER = f"""\
Caught ValueError in DataLoader worker process 0.
Original Traceback (most recent call last):
  File "{SITE}worker.py", line 374, in _worker_loop
    data = fetcher.fetch(index)  # type: ignore[possibly-undefined]
           ^^^^^^^^^^^^^^^^^^^^
  File "{SITE}fetch.py", line 54, in fetch
    data = [self.dataset[idx] for idx in possibly_batched_index]
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "{SITE}fetch.py", line 54, in <listcomp>
    data = [self.dataset[idx] for idx in possibly_batched_index]
            ~~~~~~~~~~~~^^^^^
  File "/work/main/tests/unit/artifacts/logs/train_loader.py", line 29, in __getitem__
    raise ValueError(f"shard for sample {{index}} is truncated")
ValueError: shard for sample 40 is truncated"""


def closed(peer: str) -> str:
    host, port = peer.rsplit(":", 1)
    return f"{PAIR}553] Connection closed by peer [{host}]:{port}. {CRASHING}"


def reset(peer: str) -> str:
    host, port = peer.rsplit(":", 1)
    return f"{PAIR}537] Read error [{host}]:{port}: Connection reset by peer. {HANGING}"


# (type, message, file, line, function, lost_peer, peer)
def own_raise() -> tuple:
    return ("RuntimeError", "bad batch at step 5", "hang_train.py", 134, "main", False, None)


def in_backward(message: str, peer: str | None) -> tuple:
    """A victim: DDP's all_reduce in loss.backward() (hang_train.py's train_step) lost its peer."""
    return ("RuntimeError", message, "hang_train.py", 100, "train_step", True, peer)


def wrapped(step: int, peer: str | None) -> tuple:
    """A victim whose all_reduce error train_faults.py re-raises as its own ValueError."""
    return ("ValueError", f"gradient sync failed at step {step}", "train_faults.py", 51, "sync_gradients", True, peer)


def aborted(type_: str, message: str) -> tuple:
    return (type_, message, None, None, None, False, None)


# Every log, every writer in it with an exception, and nothing else: a writer left out ended
# without one (a rank stopped by torchrun's SIGTERM, a rank that left cleanly, torchrun itself).
EXPECTED: dict[str, dict[Origin, tuple]] = {
    # rank 1 raises RuntimeError at step 5; its peers on both nodes lose it.
    "raise/master.log": {tee(1): own_raise(), tee(0): in_backward(closed("10.213.1.200:14476"), "10.213.1.200:14476")},
    "raise/worker1.log": {tee(0): in_backward(closed("10.213.1.200:39610"), "10.213.1.200:39610"),
                          tee(1): in_backward(closed("10.213.1.200:52374"), "10.213.1.200:52374")},
    # The same without --tee: torch's "[rankN]: " alone says whose traceback it is; the abort is nobody's.
    "raise-notee/master.log": {marked(1): own_raise(), marked(0): in_backward(closed("10.213.1.200:3780"), "10.213.1.200:3780"),
                               NODE: aborted("std::terminate", NO_EXCEPTION)},
    "raise-notee/worker1.log": {marked(2): in_backward(closed("10.213.1.200:35509"), "10.213.1.200:35509"),
                                marked(3): in_backward(closed("10.213.1.200:29836"), "10.213.1.200:29836")},
    # Under ddp-preflight --launch: rank 3 raises; lines "[worker1 r3] [rank3]: ...".
    "launch-raise/master.log": {launched("master", 0): in_backward(closed("10.213.1.11:22448"), "10.213.1.11:22448"),
                                launched("master", 1): in_backward(closed("10.213.1.11:17801"), "10.213.1.11:17801")},
    "launch-raise/worker1.log": {launched("worker1", 3): own_raise(),
                                 launched("worker1", 2): in_backward(closed("10.213.1.11:58580"), "10.213.1.11:58580")},
    # rank 3 sys.exit(3): no traceback of its own; in one run of six it aborted on its way out.
    "exit/master.log": {tee(0): in_backward(closed("10.213.1.11:55214"), "10.213.1.11:55214"),
                        tee(1): in_backward(closed("10.213.1.11:29085"), "10.213.1.11:29085")},
    "exit/worker1.log": {tee(0): in_backward(closed("10.213.1.11:33412"), "10.213.1.11:33412")},
    "exit-abort/master.log": {tee(0): in_backward(closed("10.213.1.11:420"), "10.213.1.11:420"),
                              tee(1): in_backward(closed("10.213.1.11:8616"), "10.213.1.11:8616")},
    "exit-abort/worker1.log": {tee(1): aborted("std::terminate", NO_EXCEPTION)},
    # A rank leaves the loop and ends cleanly (exit 0): its peers read "Connection closed by peer".
    "quit/master.log": {tee(0): in_backward(closed("10.213.1.200:53148"), "10.213.1.200:53148")},
    "quit/worker1.log": {tee(0): in_backward(closed("10.213.1.200:44718"), "10.213.1.200:44718"),
                         tee(1): in_backward(closed("10.213.1.200:48305"), "10.213.1.200:48305")},
    # ... rank 3 leaving: master's rank 0 lost it and aborted in its teardown (the exception stays named).
    "quit-r3/master.log": {tee(0): in_backward(closed("10.213.1.11:15765"), "10.213.1.11:15765")},
    "quit-r3/worker1.log": {tee(0): in_backward(closed("10.213.1.11:15765"), "10.213.1.11:15765")},
    # ... and in one run of sixteen the leaving rank aborts on its way out (destroy_process_group while
    # its peers are inside the all_reduce): the C++ abort with no exception, and its peers' lost peer.
    "quit-abort/master.log": {tee(0): in_backward(closed("10.213.1.11:63365"), "10.213.1.11:63365"),
                              tee(1): in_backward(closed("10.213.1.11:8607"), "10.213.1.11:8607")},
    "quit-abort/worker1.log": {tee(0): in_backward(closed("10.213.1.11:1238"), "10.213.1.11:1238"),
                               tee(1): aborted("std::terminate", NO_EXCEPTION)},
    # ... each step's metric waited for in a wrapper's work.wait(): the frame is the wrapper's.
    "quit-work/master.log": {tee(0): ("RuntimeError", closed("10.213.1.200:33173"), "hang_train.py", 68, "wait", True,
                                      "10.213.1.200:33173")},
    "quit-work/worker1.log": {tee(0): ("RuntimeError", closed("10.213.1.200:42661"), "hang_train.py", 68, "wait", True,
                                       "10.213.1.200:42661"),
                              tee(1): ("RuntimeError", closed("10.213.1.200:37516"), "hang_train.py", 68, "wait", True,
                                       "10.213.1.200:37516")},
    # rank 3 killed (SIGKILL) mid-run: its peers read a closed connection, or (another run) a reset.
    "sigkill/master.log": {tee(0): in_backward(closed("10.213.1.11:21895"), "10.213.1.11:21895"),
                           tee(1): in_backward(closed("10.213.1.11:58273"), "10.213.1.11:58273")},
    "sigkill/worker1.log": {tee(0): in_backward(closed("10.213.1.11:21895"), "10.213.1.11:21895")},
    "sigkill-reset/master.log": {tee(0): in_backward(closed("10.213.1.11:921"), "10.213.1.11:921"),
                                 tee(1): in_backward(reset("10.213.1.11:61834"), "10.213.1.11:61834")},
    "sigkill-reset/worker1.log": {},
    # Chains: rank 1 fails while handling a KeyError (its own); the others wrap Gloo's error.
    "chained/master.log": {
        tee(1): ("RuntimeError", "batch 5 is not in the cache", "train_faults.py", 42, "batch_for", False, None),
        tee(0): wrapped(5, "10.213.1.200:50563")},
    "chained/worker1.log": {tee(0): wrapped(5, "10.213.1.200:58048"), tee(1): wrapped(5, "10.213.1.200:3231")},
    # rank 1 sleeps past the group's 8 s timeout: Gloo's timeout, wrapped.
    "timeout/master.log": {tee(0): wrapped(5, None)},
    "timeout/worker1.log": {tee(0): wrapped(5, None), tee(1): wrapped(5, None)},
    # nft on worker1 rejects master's packets with a TCP reset: "Connection reset by peer" there.
    "reset/master.log": {tee(1): wrapped(13, "10.213.1.11:28566")},
    "reset/worker1.log": {tee(0): wrapped(13, "10.213.1.200:15550"), tee(1): wrapped(13, "10.213.1.200:23209")},
    # rank 1 all_reduces a longer buffer: rank 0's Gloo thread aborts (a C++ exception), rank 1 loses it.
    "size/master.log": {tee(0): aborted("gloo::EnforceNotMet", ENFORCE),
                        tee(1): ("RuntimeError", reset("10.213.1.200:9856"), "train_faults.py", 69, "main", True,
                                 "10.213.1.200:9856")},
    "size/worker1.log": {tee(0): wrapped(5, "10.213.1.11:64684"), tee(1): wrapped(5, "10.213.1.200:5272")},
    # rank 1's DataLoader worker raises: the worker's traceback is the message; an exception
    # ignored in a __del__ at exit (every rank) is no ending.
    "loader/master.log": {tee(1): ("ValueError", WORKER, "train_loader.py", 52, "main", False, None),
                          tee(0): ("RuntimeError", closed("10.213.1.200:4793"), "train_loader.py", 56, "main", True,
                                   "10.213.1.200:4793")},
    "loader/worker1.log": {tee(0): ("RuntimeError", closed("10.213.1.200:47278"), "train_loader.py", 56, "main", True,
                                    "10.213.1.200:47278"),
                           tee(1): ("RuntimeError", closed("10.213.1.200:4839"), "train_loader.py", 56, "main", True,
                                    "10.213.1.200:4839")},
    # The lab's faults: a firewall (the link never came up) and a VPN's IPv6 hostname (own setup).
    "firewall/master.log": {tee(0): ("RuntimeError", CONNECT, "train_faults.py", 57, "main", True, None),
                            tee(1): ("RuntimeError", CONNECT, "train_faults.py", 57, "main", True, None)},
    "firewall/worker1.log": {tee(0): ("RuntimeError", CONNECT, "train_faults.py", 57, "main", True, None),
                             tee(1): ("RuntimeError", CONNECT, "train_faults.py", 57, "main", True, None)},
    "vpn-ipv6/master.log": {tee(0): ("RuntimeError", FAMILY.format("2 vs 10"), "train_faults.py", 57, "main", False, None),
                            tee(1): ("RuntimeError", FAMILY.format("2 vs 10"), "train_faults.py", 57, "main", False, None)},
    "vpn-ipv6/worker1.log": {tee(0): ("RuntimeError", FAMILY.format("10 vs 2"), "train_faults.py", 57, "main", False, None),
                             tee(1): ("RuntimeError", FAMILY.format("10 vs 2"), "train_faults.py", 57, "main", False, None)},
    # Mismatched collectives hang: stopped after 60 s, nobody printed an exception (torchrun's own is not one).
    "mismatch/master.log": {},
    "mismatch/worker1.log": {},
    # NCCL on a real H100: the watchdog's timeout (logged; the rank went on hanging), a 4-line message.
    "nccl-h100/hung-train-tail.log": {marked(0): ("c10::DistBackendError", WATCHDOG, None, None, None, True, None)},
    "nccl-h100/two-ranks-one-gpu.log": {
        marked(1): ("torch.distributed.DistBackendError", DUPLICATE.format(1, 0), "dup.py", 4, "<module>", False, None),
        marked(0): ("torch.distributed.DistBackendError", DUPLICATE.format(0, 1), "dup.py", 4, "<module>", False, None)},
}


def test_every_log_in_the_corpus_is_expected():
    logs = {str(path.relative_to(LOGS)) for path in LOGS.glob("*/*.log")}
    assert logs == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_ranks_ending_as_its_output_says(name):
    found = exceptions_by_writer(lines_of(name))
    assert {writer: (e.type, e.message, e.file, e.line, e.function, e.lost_peer, e.peer) for writer, e in found.items()} \
        == EXPECTED[name]


def writers_lines(name: str) -> dict[Origin, list[str]]:
    split: dict[Origin, list[str]] = {}
    for line in lines_of(name):
        split.setdefault(split_prefix(line)[0].writer, []).append(line)
    return split


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_reader_fed_line_by_line_ends_where_exception_in_does(name):
    for writer, lines in writers_lines(name).items():
        reader, last = Reader(), None
        for line in lines:
            last = reader.feed(line) or last
        assert last == exception_in(lines), (name, writer)
        assert (last is None) == (writer not in EXPECTED[name])


def test_an_exception_is_returned_at_its_exception_line_and_quoted_as_it_was():
    # A dying rank may print nothing after it: the exception line itself gives it.
    lines = writers_lines("raise/master.log")[tee(1)]
    reader = Reader()
    given = [(i, found) for i, line in enumerate(lines) if (found := reader.feed(line)) is not None]
    assert len(given) == 1
    at, found = given[0]
    assert lines[at] == "[default1]:[rank1]: RuntimeError: bad batch at step 5\n"
    assert found.quote == ("[default1]:[rank1]: RuntimeError: bad batch at step 5",
                           '[default1]:[rank1]:   File "/work/main/examples/hang_train.py", line 134, in main')
    assert found.path == "/work/main/examples/hang_train.py" and found.kind is ExceptionKind.RAISED


def test_a_message_over_several_lines_is_given_again_fuller_and_ends_at_another_ranks_traceback():
    lines = lines_of("nccl-h100/two-ranks-one-gpu.log")
    reader = Reader()
    given = [found for line in lines if (found := reader.feed(line)) is not None]
    messages = [found.message for found in given[:4]]
    assert messages == ["\n".join(DUPLICATE.format(1, 0).split("\n")[:n]) for n in (1, 2, 3, 4)]
    assert given[4].message.startswith("NCCL error in:") and given[4].quote[0].startswith("[rank0]: ")


def test_the_same_exception_bare_teed_and_launched():
    teed = exceptions_by_writer(lines_of("raise/master.log"))[tee(1)]
    bare = exceptions_by_writer(lines_of("raise-notee/master.log"))[marked(1)]
    relaunched = exceptions_by_writer(lines_of("launch-raise/worker1.log"))[launched("worker1", 3)]
    assert [strip_prefix(q) for q in teed.quote] == [strip_prefix(q) for q in bare.quote] == \
        [strip_prefix(q) for q in relaunched.quote] == \
        ["RuntimeError: bad batch at step 5", '  File "/work/main/examples/hang_train.py", line 134, in main']
    assert relaunched.quote[0] == "[worker1 r3] [rank3]: RuntimeError: bad batch at step 5"


def test_what_is_found_is_plain_data_for_json():
    # The launcher writes each rank's exception into result.json (dataclasses.asdict, json.dumps).
    found = exceptions_by_writer(lines_of("size/master.log"))
    assert json.loads(json.dumps(asdict(found[tee(0)])))["kind"] == "aborted"
    assert json.loads(json.dumps(asdict(found[tee(1)])))["peer"] == "10.213.1.200:9856"


def test_prefixes_of_the_launcher_tee_and_torch():
    assert split_prefix("[worker1 r3] [rank3]: Traceback (most recent call last):\n") == \
        (Origin(node="worker1", rank=3, marker=3), "Traceback (most recent call last):")
    assert split_prefix("[default1]:[rank1]:   File \"/work/main/examples/hang_train.py\", line 134, in main\n") == \
        (Origin(local_rank=1, marker=1), '  File "/work/main/examples/hang_train.py", line 134, in main')
    assert split_prefix("[worker1] W1125 03:28:35.707000 24655 torch/distributed/elastic/multiprocessing/api.py:1028] x") \
        == (Origin(node="worker1"), "W1125 03:28:35.707000 24655 torch/distributed/elastic/multiprocessing/api.py:1028] x")
    # a C++ log line: torch's marker, then c10's header (not a prefix)
    assert split_prefix("[rank0]:[E1123 06:23:08.771371438 ProcessGroupNCCL.cpp:689] [Rank 0] Watchdog")[1] == \
        "[E1123 06:23:08.771371438 ProcessGroupNCCL.cpp:689] [Rank 0] Watchdog"
    assert strip_prefix("[default0]:\n") == ""
    # A progress bar's carriage returns: the terminal shows what came last; colour codes go.
    assert strip_prefix("[default0]: 45%|####5     | 45/100\r\x1b[31mTraceback (most recent call last):\x1b[0m\n") == \
        "Traceback (most recent call last):"


def test_chains_name_the_last_raised_and_are_victims_when_any_link_lost_the_peer():
    found = exceptions_by_writer(lines_of("chained/master.log"))
    wrapper = found[tee(0)]
    assert wrapper.cause == f"RuntimeError: {closed('10.213.1.200:50563')}"
    assert wrapper.quote[0] == "[default0]:[rank0]: ValueError: gradient sync failed at step 5"
    assert wrapper.quote[2] == f"[default0]:[rank0]: RuntimeError: {closed('10.213.1.200:50563')}"
    # The culprit's chain is its own errors only (KeyError, then RuntimeError while handling it).
    assert (found[tee(1)].lost_peer, found[tee(1)].cause) == (False, None)
    timed_out = exceptions_by_writer(lines_of("timeout/worker1.log"))
    assert timed_out[tee(0)].cause == "RuntimeError: " + TIMED_OUT.format(129, "send")
    assert timed_out[tee(1)].cause == "RuntimeError: " + TIMED_OUT.format(78, "recv")


def test_a_c_plus_plus_abort_and_an_abort_after_an_exception():
    size = exceptions_by_writer(lines_of("size/master.log"))[tee(0)]
    assert size.kind is ExceptionKind.ABORTED
    assert size.quote == ("[default0]:terminate called after throwing an instance of 'gloo::EnforceNotMet'",
                          f"[default0]:  what():  {ENFORCE}")
    # master's rank 0 lost its peer, then aborted in its teardown: still named by its exception.
    lines = writers_lines("quit-r3/master.log")[tee(0)]
    assert "[default0]:terminate called without an active exception\n" in lines
    assert exception_in(lines).type == "RuntimeError"
    watchdog = exception_in(lines_of("nccl-h100/hung-train-tail.log"))
    assert watchdog.kind is ExceptionKind.LOGGED and watchdog.quote[0].startswith("[rank0]:[E1123 06:23:08.771371438")


def test_an_exception_ignored_at_exit_is_no_ending():
    for name, writer in (("loader/master.log", tee(1)), ("loader/master.log", tee(0))):
        lines = writers_lines(name)[writer]
        ignored = [i for i, line in enumerate(lines) if "Exception ignored in: <function MetricsFile.__del__" in line]
        assert ignored and lines[-1].endswith("OSError: metrics.jsonl is already closed\n")
        assert exception_in(lines).type in ("ValueError", "RuntimeError")
        assert exception_in(lines[:ignored[0]]) == exception_in(lines)


@pytest.mark.parametrize(("type_", "message", "lost"), [
    ("RuntimeError", closed("10.213.1.200:14476"), True),
    ("RuntimeError", reset("10.213.1.11:61834"), True),
    ("RuntimeError", TIMED_OUT.format(78, "recv"), True),
    ("RuntimeError", TIMED_OUT.format(129, "send"), True),
    ("RuntimeError", CONNECT, True),
    ("c10::DistBackendError", WATCHDOG, True),
    ("RuntimeError", FAMILY.format("2 vs 10"), False),
    ("gloo::EnforceNotMet", ENFORCE, False),
    ("torch.distributed.DistBackendError", DUPLICATE.format(1, 0), False),
    ("RuntimeError", "bad batch at step 5", False),
    # a socket error of the training's own (no Gloo, NCCL or c10d in it) is its own
    ("urllib.error.URLError", "<urlopen error [Errno 104] Connection reset by peer>", False),
])
def test_the_lost_peer_catalogue(type_, message, lost):
    assert lost_peer(type_, message) is lost


# -- torchrun's summary ----------------------------------------------------------------------

# (rank, local_rank, exitcode, pid, signal, timestamp, host, others as (rank, exitcode, signal))
FIRST_OBSERVED = {
    "raise/master.log": (1, 1, 1, 24990, None, "2026-11-25_03:29:30", "master", [(0, -15, "SIGTERM")]),
    "raise/worker1.log": (2, 0, 1, 24987, None, "2026-11-25_03:29:31", "worker1", [(3, -15, "SIGTERM")]),
    "raise-notee/master.log": (1, 1, -6, 25031, "SIGABRT", "2026-11-25_03:29:38", "master", [(0, -15, "SIGTERM")]),
    "exit/worker1.log": (3, 1, 3, 25057, None, "2026-11-25_03:29:46", "worker1", [(2, -15, "SIGTERM")]),
    "exit-abort/worker1.log": (3, 1, -6, 26673, "SIGABRT", "2026-11-25_03:34:48", "worker1", [(2, -15, "SIGTERM")]),
    "quit/master.log": (0, 0, 1, 25104, None, "2026-11-25_03:29:54", "master", []),
    "quit-abort/worker1.log": (3, 1, -6, 28954, "SIGABRT", "2026-11-25_03:39:11", "worker1", [(2, -15, "SIGTERM")]),
    "loader/master.log": (1, 1, 1, 31838, None, "2026-11-25_03:43:38", "master", [(0, -15, "SIGTERM")]),
    "sigkill/worker1.log": (3, 1, -9, 25358, "SIGKILL", "2026-11-25_03:31:29", "worker1", [(2, -15, "SIGTERM")]),
    "firewall/worker1.log": (2, 0, 1, 25499, None, "2026-11-25_03:33:20", "worker1", [(3, 1, None)]),
    "nccl-h100/two-ranks-one-gpu.log": (1, 1, 1, 500, None, "2026-11-23_07:04:42", "localhost", [(0, 1, None)]),
}


@pytest.mark.parametrize("name", sorted(FIRST_OBSERVED))
def test_torchruns_first_observed_failure(name):
    found = first_observed_failure(lines_of(name))
    assert found is not None
    others = [(o.rank, o.exitcode, o.signal) for o in found.others]
    assert (found.rank, found.local_rank, found.exitcode, found.pid, found.signal, found.timestamp, found.host, others) \
        == FIRST_OBSERVED[name]
    assert found.error_file is None                        # "<N/A>": the script does not use @record
    assert found.script is not None and found.script.endswith(".py")
    if found.signal:
        assert found.traceback == f"Signal {-found.exitcode} ({found.signal}) received by PID {found.pid}"
    else:
        assert found.traceback == "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
    rank_line, exitcode_line = found.quote             # as they were (the H100 recording lost its trailing blanks)
    assert rank_line == f"  rank      : {found.rank} (local_rank: {found.local_rank})"
    assert exitcode_line.rstrip() == f"  exitcode  : {found.exitcode} (pid: {found.pid})" + \
        (f"  ({found.signal})" if found.signal else "")


def test_no_summary_where_torchrun_was_stopped_first():
    # The launcher stops a node's torchrun (SIGTERM) before it prints one; a hang stopped, likewise.
    for name in ("launch-raise/worker1.log", "mismatch/master.log", "nccl-h100/hung-train-tail.log"):
        assert first_observed_failure(lines_of(name)) is None, name


def test_the_summary_under_the_launchers_prefix():
    lines = [f"[worker1] {line}" for line in lines_of("raise/worker1.log")]
    prefixed, bare = first_observed_failure(lines), first_observed_failure(lines_of("raise/worker1.log"))
    assert prefixed is not None and bare is not None
    assert replace(prefixed, quote=()) == replace(bare, quote=())
    assert prefixed.quote == tuple(f"[worker1] {line}" for line in bare.quote)


# -- the rank's own record, really written by the bootstrap --------------------------------------

def bootstrapped(tmp_path: Path, script: Path, env: dict | None = None) -> subprocess.Popen:
    folder = tmp_path / "fr"
    folder.mkdir(mode=0o700, exist_ok=True)
    return subprocess.Popen([sys.executable, "-u", str(BOOTSTRAP), str(script)], cwd=tmp_path,
                            env={**os.environ, **(env or {}), rank_bootstrap.FOLDER_VARIABLE: str(folder)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ending(tmp_path: Path, pid: int) -> dict:
    return json.loads((tmp_path / "fr" / f"{pid}.end").read_text())


def test_from_record_of_a_script_that_raised(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        def load(step):
            raise ValueError(f"shard {step} is empty")

        def main():
            for step in range(3):
                load(step)

        main()
        """))
    rank = bootstrapped(tmp_path, script)
    _, stderr = rank.communicate(timeout=60)
    record = ending(tmp_path, rank.pid)
    assert record["how"] == "raised"
    found = from_record(record)
    assert found is not None
    assert (found.type, found.message, found.file, found.line, found.function, found.lost_peer, found.peer) == \
        ("ValueError", "shard 0 is empty", "train.py", 2, "load", False, None)
    # What the rank printed says the same, in the same words.
    printed = exception_in(stderr.splitlines())
    assert printed is not None and printed.quote == found.quote == \
        ("ValueError: shard 0 is empty", f'  File "{script}", line 2, in load')
    assert from_record({**record, "how": "exit", "code": 3}) is None




def test_from_record_of_a_gloo_rank_that_lost_its_peer(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import datetime, os, torch, torch.distributed as dist

        def sync(t):
            dist.all_reduce(t)

        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
        t = torch.ones(4)
        sync(t)
        if dist.get_rank() == 1:
            os._exit(0)                  # gone without a word: its sockets close
        for _ in range(1000):
            sync(t)
        """))
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2", "GLOO_SOCKET_IFNAME": "lo"}
    ranks = [bootstrapped(tmp_path, script, {**env, "RANK": str(rank)}) for rank in (0, 1)]
    outputs = [rank.communicate(timeout=120) for rank in ranks]
    found = from_record(ending(tmp_path, ranks[0].pid))
    assert found is not None and (found.type, found.file, found.line, found.function, found.lost_peer) == \
        ("RuntimeError", "train.py", 4, "sync", True)
    assert found.peer is not None and found.peer.startswith("127.0.0.1:")
    printed = exception_in(outputs[0][1].splitlines())     # "[rank0]: ..." on stderr
    assert printed is not None
    assert (printed.type, printed.message, printed.line, printed.lost_peer, printed.peer) == \
        (found.type, found.message, found.line, True, found.peer)
    assert not (tmp_path / "fr" / f"{ranks[1].pid}.end").exists()


# -- bounded memory --------------------------------------------------------------------------

STREAM_BYTES = 200 * 1024 * 1024


def ordinary_lines() -> Iterator[str]:
    """200 MB of a long run's ordinary output (1000 lines made once, over and over), with a
    100 000-frame traceback in it, then the real exception at the end."""
    kinds = ["[default0]:step {} loss 0.3365 lr 3.0e-04 tokens/s 123456 mfu 12.3 dt 123.4ms\n",
             "[worker1 r3] step {} loss 3.1987\n",
             "[default1]:[W1125 03:05:01.515250012 socket.cpp:207] [c10d] The hostname of the client socket cannot be"
             " retrieved. err=-3 ({})\n",
             "W1125 03:05:05.715000 14257 .venv/lib/python3.11/site-packages/torch/distributed/elastic/agent.py:1028] {}\n"]
    block = [kinds[i % 4].format(i) for i in range(1000)]
    size = sum(len(line) for line in block)
    for repeat in range(STREAM_BYTES // size + 1):
        if repeat == 100:
            yield "[default0]:[rank0]: Traceback (most recent call last):\n"
            for depth in range(100_000):
                yield f'[default0]:[rank0]:   File "/home/me/train.py", line {depth}, in recurse\n'
            yield "[default0]:[rank0]: RecursionError: maximum recursion depth exceeded\n"
        yield from block
    yield from writers_lines("raise/master.log")[tee(1)]


def test_a_reader_keeps_memory_bounded_over_a_200_mb_stream():
    reader, last = Reader(), None
    tracemalloc.start()
    try:
        for line in ordinary_lines():
            found = reader.feed(line)
            if found is not None:
                last = found
            del line, found
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 1024 * 1024
    assert last is not None and (last.type, last.message, last.line) == ("RuntimeError", "bad batch at step 5", 134)


def test_a_line_is_read_to_64_kib():
    reader = Reader()
    reader.feed("[rank1]: Traceback (most recent call last):\n")
    found = reader.feed("[rank1]: RuntimeError: " + "x" * (16 * 1024 * 1024) + "\n")
    assert found is not None and len(found.quote[0]) == LINE_CHARS and len(found.message) == MESSAGE_CHARS


def test_a_message_is_bounded():
    lines = ["[rank1]: Traceback (most recent call last):\n", '[rank1]:   File "/home/me/train.py", line 3, in <module>\n',
             "[rank1]: torch.distributed.DistBackendError: NCCL error in: x\n"]
    lines += [f"[rank1]: Last error: {i}\n" for i in range(10_000)]
    found = exception_in(lines)
    assert found is not None and len(found.message.split("\n")) == MESSAGE_LINES
