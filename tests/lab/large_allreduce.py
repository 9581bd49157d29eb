"""A small all_reduce, then a large one, over Gloo; one JSON line per step.

Run on each lab node with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set; PG_TIMEOUT (seconds)
bounds each collective, LARGE_BYTES is the large one's size. A path that drops large packets
lets the first through and hangs the second until PG_TIMEOUT."""

import datetime
import json
import os
import time

import torch
import torch.distributed as dist


def step(name, numel):
    tensor = torch.ones(numel, dtype=torch.float32)
    started = time.monotonic()
    try:
        dist.all_reduce(tensor)
        ok, error = bool((tensor == dist.get_world_size()).all()), None
    except Exception as exc:   # the test reads Gloo's own words
        ok, error = False, str(exc).splitlines()[0]
    print(json.dumps({"step": name, "bytes": numel * 4, "ok": ok, "error": error,
                      "seconds": round(time.monotonic() - started, 3)}), flush=True)
    return ok


dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ["PG_TIMEOUT"])))
if step("small", 2):
    step("large", int(os.environ["LARGE_BYTES"]) // 4)
os._exit(0)     # a rank whose peer timed out must not wait in the group's teardown
