"""device-dtype, ranks-per-node and omp-threads: the backend fits the device, and ranks and
threads fit the cores."""

from __future__ import annotations

from collections.abc import Iterator

from ddp_preflight.rules.environment import env_fix, env_of
from ddp_preflight.rules.facts import CpuFacts, GpuFacts, Missing
from ddp_preflight.rules.fix import change

from ..model import Context, NodeFacts, Status, Verdict

# Switches training code reads for its dtype and attention kernel (nanochat's, and common ones).
DTYPE_VARS = ("NANOCHAT_DTYPE", "DTYPE", "COMPUTE_DTYPE", "TORCH_DTYPE")


def _gpu_present(node: NodeFacts) -> str | None:
    gpu, torch = node.parsed.gpu, node.parsed.torch
    if not isinstance(torch, Missing) and torch.cuda_devices:
        return ", ".join(d.name or "?" for d in torch.cuda_devices)
    if isinstance(gpu, GpuFacts) and gpu.nvidia_devices:
        return f"{len(gpu.nvidia_devices)} NVIDIA device(s)"
    if isinstance(gpu, GpuFacts) and gpu.amd_kfd:
        return "an AMD GPU"
    return None


def check_device_dtype(ctx: Context) -> Iterator[Verdict]:
    backend, device = ctx.options.backend, ctx.options.device
    for node in ctx.reachable:
        torch = node.parsed.torch
        if isinstance(torch, Missing):
            yield Verdict(Status.SKIP, node.node, f"{node.node}: no torch to check (see torch-parity)")
            continue
        env = env_of(node)
        cpu = node.parsed.cpu
        bf16 = None if isinstance(cpu, Missing) else list(cpu.bf16_instructions)
        details = {"backend": backend, "device": device, "backends": list(torch.backends),
                   "cuda_available": torch.cuda_available, "gpu": _gpu_present(node),
                   "bf16_instructions": bf16}
        if backend == "nccl" and device == "cpu":
            yield Verdict(Status.FAIL, node.node, "NCCL moves CUDA tensors only: a CPU run needs Gloo",
                          change("--backend gloo (and init_process_group('gloo') in the training code)"), details)
            continue
        if backend not in torch.backends:
            yield Verdict(Status.FAIL, node.node,
                          f"{node.node}'s torch has no {backend} backend (it has: {', '.join(torch.backends) or 'none'})",
                          change("install a torch build with it, or pick a backend it has with --backend", node.node), details)
            continue
        if device == "cuda" and not torch.cuda_available:
            yield Verdict(Status.FAIL, node.node,
                          f"{node.node} has no usable CUDA device (torch {torch.version}, {torch.build} build)",
                          change("install the CUDA build of torch there, or train on CPU with --device cpu --backend gloo",
                                 node.node), details)
            continue
        dtype = next((env[v] for v in DTYPE_VARS if env.get(v)), None)
        gpu = _gpu_present(node)
        hidden = env.get("CUDA_VISIBLE_DEVICES", None) == ""
        if device == "cpu" and dtype and "bf16" in dtype.replace("bfloat16", "bf16") and not bf16:
            yield Verdict(Status.WARN, node.node,
                          f"bf16 on {node.node}'s CPU, which has no bf16 instructions (no avx512_bf16 or AMX): "
                          "much slower than float32",
                          env_fix(ctx, node.node, [(next(v for v in DTYPE_VARS if env.get(v)), "float32")],
                                  every_node=True), details)
        elif device == "cpu" and gpu and not hidden and not (dtype and "32" in dtype):
            yield Verdict(Status.WARN, node.node,
                          f"{node.node} has {gpu} but trains on CPU: code that asks torch.cuda.is_available() "
                          "picks bf16 and flash attention anyway",
                          env_fix(ctx, node.node, [("NANOCHAT_DTYPE", "float32"), ("NANOCHAT_FORCE_SDPA", "1")],
                                  every_node=True, note="your code's switches; or " + env_fix(
                                      ctx, node.node, [("CUDA_VISIBLE_DEVICES", "")], every_node=True, where=False).text()
                                  + " to hide the GPU"), details)
        elif device == "cuda" and backend == "gloo":
            yield Verdict(Status.WARN, node.node, "CUDA tensors over Gloo are copied through the CPU: use NCCL",
                          change("--backend nccl"), details)
        else:
            yield Verdict(Status.PASS, node.node,
                          f"{backend} on {device}" + (f", dtype {dtype}" if dtype else "")
                          + (f"; {gpu} present and hidden" if gpu and hidden else ""), None, details)


def _threads_advised(cpu: CpuFacts, procs: int) -> int:
    """Threads per rank that use the node's cores without oversubscribing them."""
    cores = min(cpu.physical_cores, cpu.usable_cores or cpu.physical_cores)
    return max(1, cores // procs)


def check_omp_threads(ctx: Context) -> Iterator[Verdict]:
    # Every node's advice: said once for all (--env OMP_NUM_THREADS=N) where it is the same.
    advice = {n.node: _threads_advised(cpu, max(1, ctx.options.nproc_on(n.node))) for n in ctx.reachable
              if not isinstance(cpu := n.parsed.cpu, Missing)}
    for node in ctx.reachable:
        procs = max(1, ctx.options.nproc_on(node.node))      # its own ranks (a hostfile's slots)
        cpu = node.parsed.cpu
        if isinstance(cpu, Missing):
            yield Verdict(Status.ERROR, node.node, f"{node.node}: {cpu.reason}")
            continue
        cores = min(cpu.physical_cores, cpu.usable_cores or cpu.physical_cores)
        raw = env_of(node).get("OMP_NUM_THREADS")
        best = advice[node.node]
        details = {"physical_cores": cpu.physical_cores, "usable_cores": cpu.usable_cores,
                   "logical_cores": cpu.logical_cores, "omp_num_threads": raw, "nproc_per_node": procs,
                   "recommended": best}
        fix = env_fix(ctx, node.node, [("OMP_NUM_THREADS", str(best))], every_node=len(set(advice.values())) == 1)
        if raw is None and ctx.options.launch and ctx.options.device == "cpu":
            # launch/plan.py sets the advice for the ranks it starts (a node's own value passes through).
            yield Verdict(Status.PASS, node.node,
                          f"OMP_NUM_THREADS is not set: --launch sets it to {best} for each of {procs} process(es) "
                          f"on {cores} cores", None, details)
            continue
        if raw is None:
            if procs > 1 and ctx.options.device == "cpu" and best > 1:
                yield Verdict(Status.WARN, node.node,
                              f"OMP_NUM_THREADS is not set: torchrun sets it to 1 for {procs} processes, so each "
                              f"rank computes on one of {cores} cores", fix, details)
            else:
                # torchrun sets OMP_NUM_THREADS=1 when it starts more than one process per node.
                threads = cores if procs == 1 else 1
                yield Verdict(Status.PASS, node.node,
                              f"{threads} thread{'s' if threads > 1 else ''} for each of {procs} process(es) "
                              f"on {cores} cores", None, details)
            continue
        try:
            threads = int(raw)
        except ValueError:
            yield Verdict(Status.FAIL, node.node, f"OMP_NUM_THREADS={raw!r} is not a number", fix, details)
            continue
        total = threads * procs
        if total > cores:
            yield Verdict(Status.WARN, node.node,
                          f"{threads} threads x {procs} processes = {total} on {cores} physical cores: "
                          "oversubscribed, ranks slow each other down", fix, details)
        elif ctx.options.device == "cpu" and total * 2 <= cores:
            yield Verdict(Status.WARN, node.node,
                          f"{threads} threads x {procs} processes use {total} of {cores} physical cores", fix, details)
        else:
            yield Verdict(Status.PASS, node.node, f"{threads} threads x {procs} processes on {cores} physical cores",
                          None, details)


def check_ranks_per_node(ctx: Context) -> Iterator[Verdict]:
    """Every node starts --nproc-per-node ranks (or its hostfile slots): each needs a core of its own on a CPU run."""
    if ctx.options.device == "cuda":
        # The GPU side goes here: ranks per node against the GPUs each node's torch sees.
        yield Verdict(Status.SKIP, None, "not checked for --device cuda yet (ranks against each node's GPUs)")
        return
    cpus = {n.node: n.parsed.cpu for n in ctx.reachable}
    usable = {name: None if isinstance(cpu, Missing) else cpu.usable_cores for name, cpu in cpus.items()}
    fewest = min((c for c in usable.values() if c), default=None)
    for node in ctx.reachable:
        cores, cpu = usable[node.node], cpus[node.node]
        if not cores:
            why = cpu.reason if isinstance(cpu, Missing) else "the CPU facts have no usable core count"
            yield Verdict(Status.ERROR, node.node, f"{node.node}: {why}")
            continue
        ranks = ctx.options.nproc_on(node.node)
        details = {"nproc_per_node": ranks, "usable_cores": cores, "device": ctx.options.device}
        if ranks > cores:
            # A hostfile that gives each host its own slots: that host's line is what to change.
            fix = change(f"slots={cores} for {node.node} in the hostfile", node.node) if node.node in ctx.options.nprocs \
                else change(f"--nproc-per-node {fewest}", note="the fewest usable cores of any node")
            yield Verdict(Status.FAIL, node.node,
                          f"{ranks} ranks {'on ' + node.node if node.node in ctx.options.nprocs else 'per node'}, but "
                          f"{node.node} has {cores} usable core{'s' if cores > 1 else ''}: each rank needs at least "
                          "a core of its own", fix, details)
        else:
            yield Verdict(Status.PASS, node.node,
                          f"{ranks} rank{'s' if ranks > 1 else ''} on {cores} usable cores", None, details)
