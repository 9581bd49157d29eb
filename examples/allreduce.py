"""A tiny DDP step: create the Gloo process group, all_reduce, print one JSON line.

Run by torchrun (RANK etc. in the environment) or directly with RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set. PG_TIMEOUT bounds process-group creation (seconds)."""

import datetime
import json
import os
import socket
import time

import torch
import torch.distributed as dist

started = time.monotonic()
timeout = datetime.timedelta(seconds=float(os.environ.get("PG_TIMEOUT", "30")))
try:
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = torch.full((4,), float(rank + 1))
    dist.all_reduce(tensor)
    dist.destroy_process_group()
    print(json.dumps({"ok": True, "host": socket.gethostname(), "rank": rank, "world": world,
                      "sum": tensor.tolist(), "seconds": time.monotonic() - started}), flush=True)
except Exception as exc:   # the test reads the backend's own message
    print(json.dumps({"ok": False, "host": socket.gethostname(), "error": str(exc),
                      "seconds": time.monotonic() - started}), flush=True)
    raise SystemExit(1) from None
