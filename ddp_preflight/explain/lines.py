"""A file, line by line, in bounded memory and at the speed of a byte search: a block in which no
line can matter (none of the catalogue's words, none of the words that start a failure's lines,
and every reader between failures) is counted, not split (a 1 GB log of step lines is mostly such
blocks); an input shorter than a block (a paste) is read whole, as paste.py undoes what a terminal and
a browser did to it."""

from __future__ import annotations

from collections.abc import Callable
from typing import BinaryIO

from .paste import lines_of

BLOCK = 1 << 20             # bytes read at a time
LINE_BYTES = 1 << 16        # a line longer than this is cut (transport/lines.py cuts a rank's line there too)

# A failure's lines in a long log come with one of these, in their block or the one before: the
# catalogue's messages (rules/failures.py) with the traceback or the C++ abort of the exception
# that carries them, NCCL's and the store's warnings before it, torchrun's table after its own
# traceback; failures.py's lines outside a traceback: watchdog, usage error, the OOM killer;
# torchrun's "failed (exitcode: N)" line. Each word costs a search of every block (0.3-0.6 s per
# GB here, loaded): the set stays small.
TRIGGERS = (b"Traceback", b"terminate called", b"Watchdog caught", b"Exception ignored", b": error: ",
            b"Out of memory", b"last_enqueued_collective", b"failed (exitcode")


def scan(stream: BinaryIO, feed: Callable[[int, str], None], idle: Callable[[], bool]) -> int:
    """Feed every line that may matter, with its number (from 1), to `feed`; `idle()` says whether
    the readers are between failures (then a block without a trigger is skipped). Returns the
    number of lines."""
    number = 0
    carry = b""
    hot = False              # the block before had a trigger: what follows it may continue it
    first = True
    while True:
        chunk = _block(stream)
        if not chunk:
            break
        if first and len(chunk) < BLOCK:
            # an input shorter than a block (a paste, stdin) is read whole, every line, as its writer printed it
            text = chunk.decode("utf-8", "replace")
            count = text.count("\n") + (0 if text.endswith("\n") else 1)
            for number, line in lines_of(text):
                feed(number, line[:LINE_BYTES])
            return count
        first = False
        data = carry + chunk if carry else chunk
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            if len(data) > LINE_BYTES:       # one endless line: keep its start, drop the rest of this block
                carry = data[:LINE_BYTES]
            else:
                carry = data
            continue
        block, carry = data[:cut], data[cut:]
        if len(carry) > LINE_BYTES:
            carry = carry[:LINE_BYTES]
        triggered = any(word in block for word in TRIGGERS)
        if not triggered and not hot and idle():
            number += block.count(b"\n")
            continue
        hot = triggered
        for raw in block.split(b"\n")[:-1]:
            number += 1
            feed(number, raw[:LINE_BYTES].decode("utf-8", "replace"))
    if carry:
        number += 1
        feed(number, carry.decode("utf-8", "replace"))
    return number


def _block(stream: BinaryIO) -> bytes:
    """BLOCK bytes, or what is left: a pipe gives less at a time."""
    parts, size = [], 0
    while size < BLOCK:
        data = stream.read(BLOCK - size)
        if not data:
            break
        parts.append(data)
        size += len(data)
    return b"".join(parts)
