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
store is read by a short-lived `python -c` of the agent's own Python (the training
environment's), its orders on stdin, started from / so that no module of the current folder is
imported. It is a plain client: no world size, so it adds nothing to the count of workers a
rank-0-hosted store waits for, and it only reads."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from typing import Optional

# The Python functions a rank sits in while it creates its process group (hangwatch/classify.py
# reads the same names as "rendezvous"; a unit test keeps the two in step).
RENDEZVOUS_FUNCTIONS = {"init_process_group", "_new_process_group_helper", "new_group", "rendezvous",
                        "_store_based_barrier", "_create_c10d_store", "next_rendezvous", "_rendezvous"}
CHECK_IN = re.compile(r"^default_pg/[^/]+//\w+//\d+/(\d+)$")     # Gloo: one key per rank
CONNECT_TIMEOUT = 3.0     # seconds for the store to answer
READ_TIMEOUT = 15.0       # seconds for the whole read: import torch is slow on a busy node
MOST_KEYS = 100_000       # a store's keys read at most

READER = r"""
import datetime, json, sys
ask = json.loads(sys.stdin.read())
from torch.distributed import TCPStore
store = TCPStore(ask["host"], ask["port"], is_master=False, wait_for_workers=False,
                 timeout=datetime.timedelta(seconds=ask["timeout"]))
if hasattr(store, "list_keys"):
    keys, how = [k for k in store.list_keys() if k.startswith("default_pg/")], "list_keys"
else:
    keys, how = [k for k in ask["candidates"] if store.check([k])], "check"
print(json.dumps({"keys": keys[:ask["most"]], "how": how}))
"""


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
    """What the store at `master` ("addr:port", from a waiting rank's environment) says:
    {"master", "world_size", "checked_in": [ranks], "how", "seconds"}, or "error": why it could
    not be read (then no rank is named by it)."""
    said = {"master": master, "world_size": world_size}
    if not master:
        return {**said, "error": "the rank's environment has no MASTER_ADDR (init_method given in the code?)"}
    started = time.monotonic()
    try:
        host, port = address(master)
        ask = {"host": host, "port": port, "timeout": CONNECT_TIMEOUT, "most": MOST_KEYS,
               "candidates": [f"default_pg/0//cpu//0/{r}" for r in range(world_size or 0)]}
        done = subprocess.run([python, "-c", READER], input=json.dumps(ask), capture_output=True, text=True,
                              timeout=READ_TIMEOUT, cwd="/")
    except ValueError:
        return {**said, "error": f"{master} is not an address:port"}
    except subprocess.TimeoutExpired:
        return {**said, "error": f"no answer within {READ_TIMEOUT:.0f} s"}
    except OSError as exc:
        return {**said, "error": f"{python} did not run: {exc.strerror or exc}"}
    seconds = round(time.monotonic() - started, 2)
    answer = _last_json(done.stdout)
    if done.returncode != 0 or answer is None:
        why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return {**said, "error": why[:300], "seconds": seconds}
    return {**said, "checked_in": checked_in(answer.get("keys") or ()), "how": answer.get("how"), "seconds": seconds}


def _last_json(text: str) -> Optional[dict]:
    lines = text.strip().splitlines()
    try:
        value = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
