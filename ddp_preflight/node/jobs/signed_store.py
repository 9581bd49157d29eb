"""The probe jobs' rendezvous store, signed (issue 23). torchrun's TCPStore answers any client that
reaches its port, and has no way to refuse one: a stranger on the LAN who listed its keys and
overwrote them turned a passing bandwidth probe into "ValueError: basic_string". So every value
the probe's torchrun and ranks write carries a MAC of its key and value under this probe's token
(made by the master for this one job, sent to each node on stdin, handed to the job's ranks in
their environment, never in argv), and every value read is checked before torch uses it. A
value that fails is a stranger's: the process that read it says so on one marked line
(protocol.INTERFERED) and ends, and the probe says "interfered": never a crash, never a figure
measured on a stranger's numbers.

What it cannot see: a stranger who deletes a key (the process waiting for it times out, as for a
peer that never came) or adds a number to a counter (torch's own exit barrier adds; the probes'
own agreement uses signed keys instead). Text written over a counter is seen: the add fails, and
the counter read from a fresh connection is no number.

Runs in torch processes only: the torchjob program (torchrun's agent) and the jobs' ranks."""

import datetime
import hashlib
import hmac
import os
import socket
from typing import List

import torch.distributed as dist

from ddp_preflight.node import protocol

TOKEN_VARIABLE = "DDP_PREFLIGHT_STORE_TOKEN"   # the token, for the job's ranks (node/torchjob.py)
TAG_BYTES = 16
STOPPED_BY_INTERFERENCE = 4                    # the exit code of a process that found one

_found: List[str] = []      # the key of the first value that failed, in this process
_kept: List["SignedStore"] = []


class Interfered(RuntimeError):
    """A value in the store that no process of this probe wrote."""


def interference():
    """The key whose value a stranger wrote, if this process read one."""
    return _found[0] if _found else None


def token_from_environment() -> bytes:
    """A rank's token, out of its environment (nothing it starts inherits it)."""
    token = os.environ.pop(TOKEN_VARIABLE, "")
    if not token:
        raise RuntimeError("%s is not set: the probe's job runs under ddp-preflight's torchjob only" % TOKEN_VARIABLE)
    return bytes.fromhex(token)


def _bytes(value) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def _tag(token: bytes, key: str, value: bytes) -> bytes:
    name = key.encode("utf-8")
    return hmac.new(token, b"%d:%s:" % (len(name), name) + value, hashlib.sha256).digest()[:TAG_BYTES]


class SignedStore(dist.Store):
    """A store (torchrun's TCPStore) whose values carry their MAC; torch's C++ calls these methods
    like any store's (PrefixStore, Gloo's rendezvous, torchrun's rank assignment)."""

    def __init__(self, inner, token: bytes):
        super().__init__()
        self.inner, self.token = inner, token
        dist.Store.set_timeout(self, inner.timeout)

    def _sign(self, key, value) -> bytes:
        value = _bytes(value)
        return value + _tag(self.token, key, value)

    def _open(self, key, raw) -> bytes:
        raw = _bytes(raw)
        value, tag = raw[:-TAG_BYTES], raw[-TAG_BYTES:]
        if len(raw) < TAG_BYTES or not hmac.compare_digest(tag, _tag(self.token, key, value)):
            if not _found:
                _found.append(key)
            raise Interfered("the probe's store holds a value of %r that no process of this run wrote" % key)
        return value

    def _synced(self):
        # torch sets a timeout on the wrapper (through a PrefixStore, without calling ours):
        # the TCPStore's own waits follow it.
        if self.inner.timeout != self.timeout:
            self.inner.set_timeout(self.timeout)
        return self.inner

    def set(self, key, value):
        self._synced().set(key, self._sign(key, value))

    def get(self, key):
        return self._open(key, self._synced().get(key))

    def multi_set(self, keys, values):
        self._synced().multi_set(keys, [self._sign(k, v) for k, v in zip(keys, values)])

    def multi_get(self, keys):
        return [self._open(k, raw) for k, raw in zip(keys, self._synced().multi_get(keys))]

    def compare_set(self, key, expected, desired):
        expected = _bytes(expected)
        raw = self._synced().compare_set(key, self._sign(key, expected) if expected else b"",
                                         self._sign(key, desired))
        return self._open(key, raw)

    def add(self, key, amount):
        # A counter is a number the store adds to, unsigned. A stranger's text there makes the
        # store fail the add and close the connection (torchrun's exit barrier: "Failed to recv",
        # its peer's agent then waiting out the barrier). Read from a fresh connection, a value
        # that is no number is the stranger's: said as one, never as the network.
        try:
            return self._synced().add(key, amount)
        except Exception:
            if self._not_a_counter(key):
                if not _found:
                    _found.append(key)
                raise Interfered("the probe's store holds a value of %r that no process of this run wrote" % key) \
                    from None
            raise

    def _not_a_counter(self, key) -> bool:
        try:
            fresh = dist.TCPStore(self.inner.host, self.inner.port, None, False, datetime.timedelta(seconds=5),
                                  wait_for_workers=False)
            raw = bytes(fresh.get(key)) if fresh.check([key]) else b""
        except Exception:
            return False           # the store itself is gone: not known to be a stranger's
        return bool(raw) and not raw.strip().lstrip(b"-").isdigit()

    def wait(self, keys, timeout=None):
        return self._synced().wait(keys, self.timeout if timeout is None else timeout)

    def check(self, keys):
        return self._synced().check(keys)

    def delete_key(self, key):
        return self._synced().delete_key(key)

    def num_keys(self):
        return self._synced().num_keys()

    # The names torch's C++ looks these two up by (the others it looks up by their Python names).
    def deleteKey(self, key):
        return self.delete_key(key)

    def getNumKeys(self):
        return self.num_keys()

    def set_timeout(self, timeout):
        dist.Store.set_timeout(self, timeout)
        self.inner.set_timeout(timeout)


def rank_store(timeout: datetime.timedelta) -> SignedStore:
    """This rank's client of its torchrun's store (MASTER_ADDR:MASTER_PORT, as env:// connects
    under torchrun), signed with the probe's token."""
    # No "init/" counter (unsigned, and a stranger's value there breaks the connection): the
    # process group's own keys are what the rank waits for.
    inner = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False, timeout,
                          wait_for_workers=False)
    store = SignedStore(inner, token_from_environment())
    _kept.append(store)       # torch holds the C++ half only: the methods above live in this object
    return store


def forget() -> None:
    """Let go of this process's clients (their connections close with them): the probes that ran
    in a launched rank, before the training's code (node/jobs/probes.py's in_rank)."""
    _kept.clear()


def stop_if_interfered(by: str) -> None:
    """Once a stranger's value was seen: one marked line, and this process ends (its results
    would rest on the stranger's numbers)."""
    key = interference()
    if key is None:
        return
    protocol.emit(protocol.INTERFERED, {"key": key, "by": by, "host": socket.gethostname()})
    os._exit(STOPPED_BY_INTERFERENCE)
