"""The compute program, ON one node under the supervisor (torch and the standard library): a
short fp32 matmul benchmark with the node's real thread setting. Prints one COMPUTE line of JSON
with the GFLOP/s.

Training's heavy work is mostly matmuls, so their rate compares the nodes' speed fairly. The
figure is the best of many timed products: what the node can do. Another process that takes
the cores for a moment slows some products, not all (the median is reported beside it)."""

import os
import statistics
import time

from .. import protocol
SIZE = 1024                 # one size on every node, so the rates compare: 2.1 GFLOP per product
BUDGET_SECONDS = 0.5         # default; a second look at a suspected straggler takes longer
MIN_ITERATIONS = 5          # even on a slow node (a 5 GFLOP/s one takes 2 s)


def main(spec: dict, work=None) -> int:
    """spec: {"threads": n or null (torch's own choice), "seconds": budget}"""
    threads, seconds = spec.get("threads"), float(spec.get("seconds") or BUDGET_SECONDS)

    import torch                 # here: the master imports this module's names without torch

    default_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    torch.manual_seed(0)
    a, b = torch.rand(SIZE, SIZE), torch.rand(SIZE, SIZE)
    torch.mm(a, b)               # warm up: thread pool start, first-call paths
    times = []
    deadline = time.perf_counter() + seconds
    while len(times) < MIN_ITERATIONS or time.perf_counter() < deadline:
        start = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - start)
    flop = 2 * SIZE ** 3
    protocol.emit(protocol.COMPUTE, {
        "gflops": round(flop / min(times) / 1e9, 2), "median_gflops": round(flop / statistics.median(times) / 1e9, 2),
        "size": SIZE, "iterations": len(times), "threads": torch.get_num_threads(), "default_threads": default_threads,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "cpus": os.cpu_count(),
    })
    return 0
