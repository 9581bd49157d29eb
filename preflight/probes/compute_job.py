"""Runs ON one node (torch only; sent inline by the compute probe): a short fp32 matmul benchmark
with the node's real thread setting. Prints one MARKER line of JSON with the GFLOP/s.

Training's heavy work is mostly matmuls, so their rate compares the nodes' speed fairly. The
figure is the best of many timed products: what the node can do. Another process that takes
the cores for a moment slows some products, not all (the median is reported beside it)."""

import argparse
import json
import os
import statistics
import time

MARKER = "DDP_PREFLIGHT_COMPUTE "
SIZE = 1024                 # one size on every node, so the rates compare: 2.1 GFLOP per product
BUDGET_SECONDS = 0.5         # default; a second look at a suspected straggler takes longer
MIN_ITERATIONS = 5          # even on a slow node (a 5 GFLOP/s one takes 2 s)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=None, help="default: torch's own choice")
    parser.add_argument("--seconds", type=float, default=BUDGET_SECONDS)
    args = parser.parse_args()

    import torch                 # here, so the probe can import MARKER without torch

    default_threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    a, b = torch.rand(SIZE, SIZE), torch.rand(SIZE, SIZE)
    torch.mm(a, b)               # warm up: thread pool start, first-call paths
    times = []
    deadline = time.perf_counter() + args.seconds
    while len(times) < MIN_ITERATIONS or time.perf_counter() < deadline:
        start = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - start)
    flop = 2 * SIZE ** 3
    print(MARKER + json.dumps({
        "gflops": round(flop / min(times) / 1e9, 2), "median_gflops": round(flop / statistics.median(times) / 1e9, 2),
        "size": SIZE, "iterations": len(times), "threads": torch.get_num_threads(), "default_threads": default_threads,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "cpus": os.cpu_count(),
    }), flush=True)


if __name__ == "__main__":
    main()
