"""Who wrote a marked line: the program the master started, or something that shares its stdout.

A launched rank inherits its launcher's stdout, and can open every ancestor's /proc/PID/fd/N
besides (for writing, and for reading: a pipe opened there read-side steals lines), so where a
line arrives says nothing of who wrote it (issue 23). The master gives each program a fresh
random key in its spec, which travels on stdin (never argv, the environment or a file), and each
marked line the program writes ends with a tag:

    MARKER JSON WRITER.N.MAC

WRITER names the process that wrote it (random, per process), N counts its lines, MAC is the
HMAC-SHA256 of "WRITER.N LINE" under the key, cut to 128 bits. The master's Verifier takes a
marked line only when its MAC holds and its N is past the last N of that writer: a rank that
steals a line learns no key, cannot alter the line, and cannot say it again later. A marked line
that fails is passed on as the program's text, NOT_SIGNED in front, so no parser takes it.

The probe jobs' ranks are this package's own code: their torchrun hands them the key in their
environment (KEY_VARIABLE), and each takes it out of its own at once. The training's ranks under
--launch never get it: the launch program holds it in memory only.

Standard library only, Python 3.8+."""

import hashlib
import hmac
import os
from typing import Dict, Optional

KEY_VARIABLE = "DDP_PREFLIGHT_KEY"         # the key, for the probe jobs' ranks only (node/torchjob.py)
MAC_HEX = 32                               # hex digits of the MAC kept (128 bits)
NOT_SIGNED = "(unsigned marker, shown as text) "

_key = None             # bytes, once given
_writer = None          # (pid, name): a forked child names itself anew
_count = 0


def new_key() -> str:
    """A program's key: the master makes one for each program it starts."""
    return os.urandom(16).hex()


def use_key(key: Optional[str]) -> None:
    """Sign every marked line this process writes from now on with `key` (hex, from the spec)."""
    global _key
    _key = bytes.fromhex(key) if key else None


def key_from_environment() -> None:
    """A probe job's rank: the key its torchrun was given, out of the environment so that
    nothing this rank starts inherits it."""
    use_key(os.environ.pop(KEY_VARIABLE, None))


def own_key() -> Optional[str]:
    """This process's key (hex), for a program it starts itself (in that one's spec, on stdin)."""
    return _key.hex() if _key else None


def child_environment() -> dict:
    """What a probe job's torchrun hands its ranks (our own code) so that they sign too."""
    return {KEY_VARIABLE: _key.hex()} if _key else {}


def _mac(key: bytes, writer: str, text: str) -> str:
    mac = hmac.new(key, writer.encode("utf-8") + b" ", hashlib.sha256)
    mac.update(text.encode("utf-8"))       # in two parts: a facts line can be hundreds of MB
    return mac.hexdigest()[:MAC_HEX]


def sign(text: str) -> str:
    """The line with its tag; the caller holds the lock of the stream it writes to, so that a
    writer's counts reach it in order. Without a key (a test that runs a program's main() on its
    own) the line stays as it is, and the master takes no such line."""
    global _writer, _count
    if _key is None:
        return text
    if _writer is None or _writer[0] != os.getpid():
        _writer, _count = (os.getpid(), os.urandom(4).hex()), 0
    _count += 1
    writer = "%s.%d" % (_writer[1], _count)
    return "%s %s.%s" % (text, writer, _mac(_key, writer, text))


class Verifier:
    """The master's side, one per program: which marked lines that program's processes wrote."""

    def __init__(self, key: str):
        self.key = bytes.fromhex(key)
        self.last: Dict[str, int] = {}      # writer -> the last count taken from it

    def check(self, text: str) -> Optional[str]:
        """The marked line without its tag when the key signed it and it is new; None for any
        other line (forged, altered, said again, cut short)."""
        body, _, tag = text.rpartition(" ")
        parts = tag.split(".")
        if not body or len(parts) != 3 or not (parts[1].isascii() and parts[1].isdigit()) or len(parts[1]) > 18:
            return None
        name, count, mac = parts
        if not hmac.compare_digest(mac.encode(), _mac(self.key, "%s.%s" % (name, count), body).encode()):
            return None
        if int(count) <= self.last.get(name, 0):
            return None
        self.last[name] = int(count)
        return body
