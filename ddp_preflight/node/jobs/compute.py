"""The compute program, ON one node under the supervisor (torch and the standard library): a
short matmul benchmark, on the CPU (fp32, with the node's real thread setting) or, for a CUDA
run, on each GPU the node's ranks will use (bf16 where the GPU has it, fp16 before). Prints one
COMPUTE line of JSON with the GFLOP/s.

Training's heavy work is mostly matmuls, so their rate compares the nodes' speed fairly. The
figure is the best of many timed products: what the node can do. Another process that takes
the cores for a moment slows some products, not all (the median is reported beside it). One
thread's rate on its own CPU clock, and the CPUs the process may use, come beside it: what the
node computes whatever its neighbours do (docs/checks/compute-balance.md).

The GPU branch has not run on a GPU in this project's tests (there is none where they run): it
is kept small and plain; docs/gpu.md says what was verified where."""

import os
import statistics
import time

from .. import protocol

SIZE = 1024                 # one size on every node, so the rates compare: 2.1 GFLOP per product
BUDGET_SECONDS = 0.5         # default; a second look at a suspected straggler takes longer
MIN_ITERATIONS = 5          # even on a slow node (a 5 GFLOP/s one takes 2 s)
PER_THREAD_PRODUCTS = 3    # timed on one thread's CPU clock: the fastest of them
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
    used = torch.get_num_threads()
    protocol.emit(protocol.COMPUTE, {
        "gflops": round(flop / min(times) / 1e9, 2), "median_gflops": round(flop / statistics.median(times) / 1e9, 2),
        "size": SIZE, "iterations": len(times), "threads": used, "default_threads": default_threads,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "cpus": os.cpu_count(),
        "thread_gflops": round(flop / per_thread_seconds(torch, a, b, used) / 1e9, 2),
        "cpus_usable": usable_cpus(),
    })
    return 0


def per_thread_seconds(torch, a, b, used: int) -> float:
    """The CPU time one product takes on one thread: the core's own speed, which another
    process's load on the machine does not change (a product it delays takes the same CPU time),
    unlike the wall time of a product on several threads, which needs every core at once."""
    torch.set_num_threads(1)       # the product then runs on this thread: its CPU clock counts it
    try:
        spent = []
        for _ in range(PER_THREAD_PRODUCTS):
            start = time.thread_time()
            torch.mm(a, b)
            spent.append(time.thread_time() - start)
        return max(min(spent), 1e-9)
    finally:
        torch.set_num_threads(used)


def usable_cpus() -> float:
    """The CPUs this process may run on: its affinity, and its cgroup's CPU quota (a container
    or a Slurm step limited to 1.5 CPUs gets 1.5 however many threads it starts)."""
    cpus = float(len(os.sched_getaffinity(0)))
    quota = cgroup_quota()
    return min(cpus, quota) if quota else cpus


def cgroup_quota() -> "float | None":
    """CPUs allowed by the cgroup's quota (v2 cpu.max, v1 cpu.cfs_quota_us), None for none."""
    try:
        with open("/proc/self/cgroup", encoding="ascii", errors="replace") as f:
            lines = f.read(65536).splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        try:
            if controllers == "":
                with open(f"/sys/fs/cgroup{path.rstrip('/')}/cpu.max", encoding="ascii") as f:
                    quota, period = (f.read(100).split() + ["100000"])[:2]
            elif "cpu" in controllers.split(","):
                base = f"/sys/fs/cgroup/{controllers}{path.rstrip('/')}"
                with open(f"{base}/cpu.cfs_quota_us", encoding="ascii") as f:
                    quota = f.read(100).strip()
                with open(f"{base}/cpu.cfs_period_us", encoding="ascii") as f:
                    period = f.read(100).strip()
            else:
                continue
        except OSError:
            continue
        if quota not in ("max", "-1") and quota.lstrip("-").isdigit() and period.isdigit() and int(period) > 0:
            return int(quota) / int(period)
    return None


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
