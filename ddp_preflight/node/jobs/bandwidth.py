"""Runs ON every node, in each rank under torchrun (`-m ddp_preflight.node.jobs.bandwidth`; torch only): all_reduce
latency for small messages, then bus bandwidth for a large one, as nccl-tests defines it:
algbw = bytes / seconds, busbw = algbw x 2(n-1)/n. Rank 0 prints one MARKER line of JSON.

The large size is found with a time budget, not fixed: it grows until one all_reduce takes
about GOAL_SECONDS, so a 100 Mbit/s link and a 10 Gbit/s one both finish in a few seconds.
The figure is the best of a few all_reduces at that size: what the link carries when no other
process holds up a rank's CPU for a moment (the median is reported beside it)."""

import argparse
import datetime
import json
import os
import statistics
import sys
import time

from ddp_preflight.node import protocol, signing, tcp_info
from ddp_preflight.node.protocol import BANDWIDTH as MARKER

PROCESS_GROUP_TIMEOUT = datetime.timedelta(minutes=30)     # torch's default for Gloo, as before

SMALL_BYTES = (8, 1024, 65536)     # latency: one tiny message, a small bucket, a larger one
LATENCY_ITERATIONS = 15
LATENCY_BUDGET_SECONDS = 1.0
START_BYTES = 256 << 10
MAX_BYTES = 128 << 20              # each rank holds one buffer of this size at most
GOAL_SECONDS = 0.3                 # one all_reduce this long: startup costs are under a few %
TIMED_ITERATIONS = 4


def main(argv=None, rank=None, world=None, prefix=None) -> None:
    """As its own job: every rank of torchrun's. Inside the probes job (node/jobs/probes.py): the
    given ranks, in a group whose keys are under `prefix` in the store."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)

    import torch  # here, so the probe can import MARKER without torch
    import torch.distributed as dist

    from ddp_preflight.node.jobs import signed_store

    started = time.perf_counter()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}") if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # torchrun's store, every value signed (a stranger's write ends the job: "interfered").
    store = signed_store.rank_store(PROCESS_GROUP_TIMEOUT)
    dist.init_process_group(args.backend, store=dist.PrefixStore(prefix, store) if prefix else store,
                            rank=int(os.environ["RANK"]) if rank is None else rank,
                            world_size=int(os.environ["WORLD_SIZE"]) if world is None else world,
                            timeout=PROCESS_GROUP_TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    connected = time.perf_counter()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def one(tensor) -> float:
        sync()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        sync()
        return time.perf_counter() - start

    def slowest(seconds: float) -> float:
        # Every rank must pick the same next size, or the collectives would not match.
        t = torch.tensor([seconds], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def gathered(value) -> list:
        """Every rank's JSON-able value, in rank order (all_gather_object would need numpy)."""
        data = json.dumps(value).encode()
        sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
        dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64, device=device))
        lengths = [int(t.item()) for t in sizes]
        own = torch.zeros(max(1, max(lengths)), dtype=torch.uint8)
        if data:
            own[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        parts = [torch.zeros_like(own, device=device) for _ in range(world)]
        dist.all_gather(parts, own.to(device))
        return [json.loads(bytes(part[:n].cpu().tolist())) for part, n in zip(parts, lengths)]

    def buffer(size: int):
        return torch.ones(max(1, size // 4), dtype=torch.float32, device=device)

    for size in (8, 8, 8, START_BYTES):    # warm up: connections, allocator, first-call paths
        one(buffer(size))

    latency_us = {}
    for size in SMALL_BYTES:
        tensor = buffer(size)
        first = one(tensor)
        # On a very slow link, fewer repeats (every rank agrees how many): about a second per size.
        repeats = max(3, min(LATENCY_ITERATIONS, int(LATENCY_BUDGET_SECONDS / max(slowest(first), 1e-6))))
        times = [first] + [one(tensor) for _ in range(repeats - 1)]
        latency_us[str(size)] = round(statistics.median(times) * 1e6, 1)

    # The kernel's count of what this rank's connections sent, and sent again, while the large
    # messages flow: loss shows as retransmitted bytes on the sender's side of the lossy path.
    sockets_before = tcp_info.connections()
    size, tried = START_BYTES, []
    while True:
        tensor = buffer(size)
        first = one(tensor)
        seconds = slowest(first)
        tried.append({"bytes": size, "seconds": round(seconds, 4)})
        if seconds >= GOAL_SECONDS or size >= MAX_BYTES:
            break
        # Jump straight toward the goal (a power of two, at most 16x per step).
        factor = 2
        while factor < 16 and seconds * factor < GOAL_SECONDS:
            factor *= 2
        size = min(MAX_BYTES, size * factor)

    # The all_reduce that reached the goal is the first timed one.
    times = [first] + [one(tensor) for _ in range(TIMED_ITERATIONS - 1)]
    sockets_after = tcp_info.connections()
    seconds, median = slowest(min(times)), slowest(statistics.median(times))
    links = gathered(tcp_info.moved(sockets_before, sockets_after))
    nbytes = tensor.numel() * tensor.element_size()
    algbw = nbytes / seconds
    bus = 2 * (world - 1) / world      # nccl-tests' bus factor for all_reduce
    if rank == 0:
        protocol.emit(MARKER, {
            "world_size": world, "backend": args.backend, "device": device.type,
            "latency_us": latency_us,
            "bytes": nbytes, "seconds": round(seconds, 5), "median_seconds": round(median, 5),
            "iterations": [round(t, 5) for t in times],
            "algbw_bytes_per_s": round(algbw), "busbw_bytes_per_s": round(algbw * bus),
            "median_busbw_bytes_per_s": round(nbytes / median * bus),
            "sizes_tried": tried,
            # Per rank, each (local, peer) address pair: bytes sent, bytes sent again, round trip.
            "links": [{"rank": r, **pair} for r, pairs in enumerate(links) for pair in pairs or ()],
            "connect_seconds": round(connected - started, 3),
            "measure_seconds": round(time.perf_counter() - connected, 3),
        })
    dist.destroy_process_group()


if __name__ == "__main__":
    signing.key_from_environment()
    try:
        main()
    except BaseException:
        from ddp_preflight.node.jobs import signed_store
        signed_store.stop_if_interfered("rank %s" % os.environ.get("RANK"))
        raise
    # Its group is closed and rank 0's line is out: the teardown with torch loaded measures
    # nothing, and torchrun waits for it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
