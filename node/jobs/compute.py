"""The compute program, ON one node under the supervisor (torch and the standard library): a
short matmul benchmark, on the CPU (fp32, with the node's real thread setting) or, for a CUDA
run, on each GPU the node's ranks will use (bf16 where the GPU has it, fp16 before). Prints one
COMPUTE line of JSON with the GFLOP/s.

Training's heavy work is mostly matmuls, so their rate compares the nodes' speed fairly. The
figure is the best of many timed products: what the node can do. Another process that takes
the cores for a moment slows some products, not all (the median is reported beside it).

The GPU branch has not run on a GPU in this project's tests (there is none where they run): it
is kept small and plain; docs/gpu.md says what was verified where."""

import os
import statistics
import time

from .. import protocol

SIZE = 1024                 # one size on every node, so the rates compare: 2.1 GFLOP per product
BUDGET_SECONDS = 0.5         # default; a second look at a suspected straggler takes longer
MIN_ITERATIONS = 5          # even on a slow node (a 5 GFLOP/s one takes 2 s)
GPU_SIZE = 8192             # 1.1 TFLOP per product: about 2 ms on an H100 in bf16, 20 ms on a T4 in fp16
GPU_WARM_SECONDS = 0.2      # cuBLAS picks its kernel on the first call, and the clocks rise under load


def main(spec: dict, work=None) -> int:
    """spec: {"threads": n or null (torch's own choice), "seconds": budget}, or for the GPUs
    {"device": "cuda", "gpus": how many (cuda:0 ...: rank i computes on cuda:i), "seconds": budget per GPU}"""
    threads, seconds = spec.get("threads"), float(spec.get("seconds") or BUDGET_SECONDS)

    import torch  # here: the master imports this module's names without torch

    if spec.get("device") == "cuda":
        figures = on_gpus(torch, int(spec.get("gpus") or 1), seconds)
        protocol.emit(protocol.COMPUTE, figures)
        return 1 if "error" in figures else 0

    default_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    torch.manual_seed(0)
    a, b = torch.rand(SIZE, SIZE), torch.rand(SIZE, SIZE)
    torch.mm(a, b)               # warm up: thread pool start, first-call paths
    times: list = []
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


def on_gpus(torch, count: int, seconds: float) -> dict:
    """Each GPU in turn; the slowest is the node's figure (its ranks wait for it every step).
    A GPU that fails is the node's error, in the backend's own words."""
    figures = []
    for index in range(count):
        try:
            figures.append(on_gpu(torch, index, seconds))
        except Exception as exc:
            message = (str(exc).strip().splitlines() or [""])[0][:400]
            return {"device": "cuda", "error": f"GPU {index}: {type(exc).__name__}: {message}".rstrip(": ")}
    slowest = min(figures, key=lambda f: f["gflops"])
    return {"device": "cuda", "gpus": figures, "gflops": slowest["gflops"], "slowest_gpu": slowest["index"],
            "size": GPU_SIZE}


def on_gpu(torch, index: int, seconds: float) -> dict:
    """One GPU's matmul rate, timed by CUDA events around each product (the GPU's own clock)."""
    with torch.cuda.device(index):
        # bf16 on GPUs that compute it natively (compute capability 8, Ampere, and newer), as
        # mixed-precision training picks; fp16 before them.
        dtype = torch.bfloat16 if torch.cuda.get_device_capability(index)[0] >= 8 else torch.float16
        a = torch.rand(GPU_SIZE, GPU_SIZE, device="cuda", dtype=dtype)
        b = torch.rand(GPU_SIZE, GPU_SIZE, device="cuda", dtype=dtype)
        out = torch.empty(GPU_SIZE, GPU_SIZE, device="cuda", dtype=dtype)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def product() -> float:
            start.record()
            torch.mm(a, b, out=out)
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1000      # elapsed_time() is in milliseconds

        warm_until = time.perf_counter() + GPU_WARM_SECONDS
        while time.perf_counter() < warm_until:
            product()
        times: list = []
        deadline = time.perf_counter() + seconds
        while len(times) < MIN_ITERATIONS or time.perf_counter() < deadline:
            times.append(product())
        flop = 2 * GPU_SIZE ** 3
        return {"index": index, "name": torch.cuda.get_device_name(index), "dtype": str(dtype).replace("torch.", ""),
                "gflops": round(flop / min(times) / 1e9, 1), "median_gflops": round(flop / statistics.median(times) / 1e9, 1),
                "iterations": len(times)}
