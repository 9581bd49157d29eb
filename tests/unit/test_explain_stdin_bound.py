"""Issue 34, part A: `explain -` reads an endless stdin within bounds of size and time, and says
how much it read and that it stopped. Real pipes and real writer processes; the CLI as users run it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ddp_preflight.explain.inputs import STDIN_BYTES, BoundedStdin

ROOT = Path(__file__).resolve().parents[2]
FAILED = ("Traceback (most recent call last):\n  File \"/w/train.py\", line 40, in <module>\n    step()\n"
          "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n")


def explain_command(*args: str) -> list[str]:
    return [sys.executable, "-P", "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
            "from ddp_preflight.cli.explain import main; sys.exit(main(sys.argv[1:]))", *args]


def test_an_endless_pipe_stops_at_the_size_bound_and_says_so():
    writer = subprocess.Popen(["yes", "step 12 loss 2.31"], stdout=subprocess.PIPE)
    try:
        started = time.monotonic()
        done = subprocess.run(explain_command("-"), stdin=writer.stdout, capture_output=True, text=True, timeout=240)
        took = time.monotonic() - started
    finally:
        os.kill(writer.pid, signal.SIGTERM)
        writer.wait()
    assert done.returncode == 0, done.stderr[-2000:]
    notes = [line for line in done.stdout.splitlines() if "stopped reading stdin" in line]
    assert len(notes) == 1 and notes[0].startswith("not read: -: stopped reading stdin after 1 GiB in "), done.stdout
    assert notes[0].endswith(" s, as it reached 1 GiB (stdin is read up to 1 GiB and 60 s): the rest was not read; "
                             "save it to a file and give its path"), notes[0]
    assert took < 120


def test_a_writer_that_never_ends_stops_at_the_time_bound():
    read_fd, write_fd = os.pipe()
    # A real process that trickles a line twice a second forever (the pipe's write end is its stdout).
    writer = subprocess.Popen(["sh", "-c", "while :; do echo step; sleep 0.5; done"], stdout=write_fd)
    os.close(write_fd)
    try:
        stream = BoundedStdin(read_fd, most_seconds=2.0)
        started = time.monotonic()
        data = b""
        with os.fdopen(read_fd, "rb", buffering=0, closefd=True) as _:
            while chunk := stream.read(1 << 16):
                data += chunk
        took = time.monotonic() - started
    finally:
        os.kill(writer.pid, signal.SIGTERM)
        writer.wait()
    assert 1.9 < took < 4, took
    assert stream.stopped == "time" and data.startswith(b"step\n")
    note = stream.note()
    assert note is not None and note.startswith(f"-: stopped reading stdin after {len(data)} bytes in 2 s, as it "
                                                "was still open after 2 s (stdin is read up to 1 GiB and 2 s)")


def test_a_pipe_that_ends_is_read_whole_with_no_note(tmp_path):
    log = tmp_path / "rank.log"
    log.write_text(FAILED)
    piped = subprocess.run(explain_command("-"), input=FAILED, capture_output=True, text=True, timeout=60)
    named = subprocess.run(explain_command(str(log)), capture_output=True, text=True, timeout=60)

    assert "stopped reading stdin" not in piped.stdout
    assert piped.returncode == named.returncode == 1
    assert "RuntimeError: CUDA out of memory" in piped.stdout


def test_exactly_the_cap_then_the_end_is_not_a_stop():
    read_fd, write_fd = os.pipe()
    stream = BoundedStdin(read_fd, most_bytes=10, most_seconds=5)
    os.write(write_fd, b"0123456789")
    os.close(write_fd)
    assert stream.read(100) == b"0123456789" and stream.read(100) == b""
    assert (stream.stopped, stream.note()) == (None, None)
    os.close(read_fd)
    assert STDIN_BYTES == 1 << 30
