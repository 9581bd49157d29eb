"""Who checked in to a rendezvous: the ranks' TCPStore, read as a client, for the agent.

When ranks wait in init_process_group, the store they share says which ranks got there. On
torch 2.13 with Gloo (seen on real runs, CPU), each rank that reaches Gloo's connection step
writes its address under `default_pg/<group>//<device>//<gloo device>/<rank>` (e.g.
`default_pg/0//cpu//0/3`) and then waits for every other rank's key: a rank whose key is missing
never got there. torchrun's agents add `<run id>/torchelastic/role_info/<node rank>` (one per
node's torchrun), but a rank's own process adds nothing until it creates its process group.
NCCL writes no key per rank: only rank 0's NCCL id (`default_pg/0//cuda//0`, torch's
ProcessGroupNCCL::broadcastUniqueNCCLID), so with NCCL the store cannot tell who is missing.

Importing torch costs the agent a second and hundreds of MB for the rest of the watch, so the
stores are read by a short-lived `python -c` of the agent's own Python (the training
environment's), its orders on stdin, started from / and as every node program starts a Python
(trust.python_argv: no folder of the caller's, no other user's site), so that nothing another
user placed is imported. It is a plain client: no world size, so it adds nothing to the count of workers a
rank-0-hosted store waits for, and it only reads.

Every store asked for at once is read by one such reader, all of them in parallel, under one
deadline: READ_DEADLINE seconds from the moment torch is imported, whatever their number. A store
that takes a connection and never answers holds torch's client past any timeout it is given
(seen on torch 2.13: a TCPStore client to a listener that accepts and stays silent waits for
minutes); such a store is `silent`, and the reader is killed at the deadline, so one silent store,
or a hundred, cost the read READ_DEADLINE at most."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from typing import List, Optional, Sequence, Tuple

from . import trust
from .loader_env import tool_env

# The Python functions a rank sits in while it creates its process group (hangwatch/classify.py
# reads the same names as "rendezvous"; a unit test keeps the two in step).
RENDEZVOUS_FUNCTIONS = {"init_process_group", "_new_process_group_helper", "new_group", "rendezvous",
                        "_store_based_barrier", "_create_c10d_store", "next_rendezvous", "_rendezvous"}
CHECK_IN = re.compile(r"^default_pg/[^/]+//\w+//\d+/(\d+)$")     # Gloo: one key per rank
READ_DEADLINE = 3.0       # seconds for every store's read together, once torch is imported
IMPORT_TIMEOUT = 15.0     # seconds for the reader to import torch: slow on a busy node
READ_TIMEOUT = IMPORT_TIMEOUT + READ_DEADLINE     # seconds a whole read takes at most
MOST_KEYS = 100_000       # a store's keys read at most
MOST_STORES = 32          # stores read at once at most (a node runs a few runs, not dozens)
MOST_OUTPUT = 1 << 20     # bytes of the reader's answers read at most

READER = r"""
import signal
signal.alarm(%d)      # its own end, whatever happens to the agent that started it (a SIGKILLed agent cannot stop it)
import datetime, json, sys, threading
ask = json.loads(sys.stdin.read())
from torch.distributed import TCPStore
lock = threading.Lock()
def say(said):
    with lock:
        print(json.dumps(said), flush=True)
def read(i, one):
    try:
        store = TCPStore(one["host"], one["port"], is_master=False, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=ask["timeout"]))
        if hasattr(store, "list_keys"):
            keys, how = [k for k in store.list_keys() if k.startswith("default_pg/")], "list_keys"
        else:
            keys, how = [k for k in one["candidates"] if store.check([k])], "check"
        say({"i": i, "keys": keys[:ask["most"]], "how": how})
    except Exception as exc:
        say({"i": i, "error": (type(exc).__name__ + ": " + str(exc)).splitlines()[0][:300]})
say({"ready": True})
for i, one in enumerate(ask["stores"]):
    threading.Thread(target=read, args=(i, one), daemon=True).start()
threading.Event().wait()
""" % (int(READ_TIMEOUT) + 5)


def in_rendezvous(dump) -> bool:
    """A py-spy dump (a list of threads) in which torch.distributed creates a process group."""
    if not isinstance(dump, list):
        return False
    return any(frame.get("name") in RENDEZVOUS_FUNCTIONS and "torch/distributed/" in (frame.get("filename") or "")
               for thread in dump for frame in thread.get("frames") or ())


def address(master: str):
    """("10.0.0.1", 29500) from "10.0.0.1:29500" (an IPv6 address in brackets or not)."""
    host, _, port = master.rpartition(":")
    return host.strip("[]"), int(port)


def checked_in(keys) -> list:
    """The ranks whose Gloo check-in key is in the store."""
    return sorted({int(m.group(1)) for m in map(CHECK_IN.match, keys) if m})


def read(master: Optional[str], world_size: Optional[int], python: str = sys.executable) -> dict:
    """What the store at `master` ("addr:port", from a waiting rank's environment) says (read_all's
    answer for one store)."""
    return read_all([(master, world_size)], python)[0]


def read_all(stores: Sequence[Tuple[Optional[str], Optional[int]]], python: str = sys.executable,
             deadline: float = READ_DEADLINE) -> List[dict]:
    """What each store says, in the order asked: {"master", "world_size", "checked_in": [ranks],
    "how", "seconds"}, or "error": why it could not be read (then no rank is named by it), with
    "silent": true when it did not answer within the deadline."""
    answers: List[Optional[dict]] = [None] * len(stores)
    asks: List[dict] = []
    where: List[int] = []
    for i, (master, world_size) in enumerate(stores):
        said = {"master": master, "world_size": world_size}
        if not master:
            answers[i] = {**said, "error": "the rank's environment has no MASTER_ADDR (init_method given in the code?)"}
            continue
        try:
            host, port = address(master)
        except ValueError:
            answers[i] = {**said, "error": f"{master} is not an address:port"}
            continue
        if len(asks) >= MOST_STORES:
            answers[i] = {**said, "error": f"not read: more than {MOST_STORES} stores at once"}
            continue
        asks.append({"host": host, "port": port, "candidates": [f"default_pg/0//cpu//0/{r}"
                                                                  for r in range(min(world_size or 0, 4096))]})
        where.append(i)
    if asks:
        for j, answer in enumerate(_run_reader(asks, python, deadline)):
            master, world_size = stores[where[j]]
            answers[where[j]] = {"master": master, "world_size": world_size, **answer}
    return [a if a is not None else {} for a in answers]


def _run_reader(asks: list, python: str, deadline: float) -> List[dict]:
    """One reader for every store: its answers, in the order asked."""
    started = time.monotonic()
    # torch's own timeout, shorter than the deadline: a store that refuses says so (torch retries
    # the connection until then); one that takes the connection and stays silent outlasts it.
    ask = {"stores": asks, "timeout": max(0.5, deadline - 0.5), "most": MOST_KEYS}
    # Its errors go to an unnamed file: a pipe nobody reads while the answers come could fill.
    with tempfile.TemporaryFile() as errors:
        try:
            reader = subprocess.Popen(trust.python_argv(python, READER), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=errors, cwd="/", start_new_session=True, env=tool_env())
        except OSError as exc:
            return [{"error": f"{python} did not run: {exc.strerror or exc}"} for _ in asks]
        got, ready_at = _answers(reader, ask, len(asks), started, deadline)
        errors.seek(0)
        err = errors.read(65536) if ready_at is None else b""
    out = []
    for i in range(len(asks)):
        said = got.get(i)
        if said is None:
            if ready_at is None:
                why = (err.decode(errors="replace").strip().splitlines() or
                       [f"the reader did not import torch within {IMPORT_TIMEOUT:.0f} s"])[-1][:300]
                out.append({"error": why, "seconds": round(time.monotonic() - started, 2)})
            else:
                out.append({"error": f"no answer within {deadline:g} s", "silent": True,
                            "seconds": round(time.monotonic() - started, 2)})
        elif "error" in said:
            out.append({"error": str(said["error"]), "seconds": said["seconds"]})
        else:
            out.append({"checked_in": checked_in(said.get("keys") or ()), "how": said.get("how"),
                        "seconds": said["seconds"]})
    return out


def _answers(reader: subprocess.Popen, ask: dict, count: int, started: float, deadline: float):
    """({store's index: what the reader said}, when it had imported torch or None); the reader is
    stopped when every store has answered or the deadline has passed."""
    got: dict = {}
    lines, ready_at = _Lines(reader.stdout), None
    try:
        try:
            assert reader.stdin is not None
            reader.stdin.write(json.dumps(ask).encode())
            reader.stdin.close()
        except OSError:
            pass
        while len(got) < count:
            until = (started + IMPORT_TIMEOUT) if ready_at is None else ready_at + deadline
            line = lines.next(until - time.monotonic())
            if line is None:
                break
            said = _json(line)
            if said is None:
                continue
            if said.get("ready"):
                ready_at = time.monotonic()
            elif isinstance(said.get("i"), int) and 0 <= said["i"] < count:
                got[said["i"]] = dict(said, seconds=round(time.monotonic() - started, 2))
    finally:
        _stop(reader)
    return got, ready_at


class _Lines:
    """Lines from a pipe, each waited for no longer than asked."""

    def __init__(self, pipe):
        self.fd, self.buffer, self.total, self.closed = pipe.fileno(), b"", 0, False

    def next(self, wait: float) -> Optional[bytes]:
        limit = time.monotonic() + max(0.0, wait)
        while b"\n" not in self.buffer:
            left = limit - time.monotonic()
            if self.closed or left <= 0 or self.total > MOST_OUTPUT:
                return None
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                self.closed = True
                continue
            self.buffer += chunk
            self.total += len(chunk)
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line


def _stop(reader: subprocess.Popen) -> None:
    """The reader and anything it started end now (it runs in its own session)."""
    try:
        os.killpg(reader.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        reader.wait(5)
    except subprocess.TimeoutExpired:
        pass
    if reader.stdout is not None:
        reader.stdout.close()


def _json(line: bytes) -> Optional[dict]:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
