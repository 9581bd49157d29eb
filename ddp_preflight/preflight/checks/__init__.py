"""The checks: one explicit table, the one place their ids are written. Each is a pure function
of all nodes' facts (and the probes' data) that yields verdicts; the runner stamps each with its
check's id. Find a check by its id here: the function is check_<id> in the module named beside it."""

from __future__ import annotations

import traceback
from collections.abc import Iterable

from ddp_preflight.rules.fix import text_of

from ..model import Check, Context, Result, Status
from . import (
    bandwidth,
    clock,
    collectives,
    data_shards,
    gpu,
    hardware,
    imports,
    launch_args,
    nccl,
    network,
    path_mtu,
    ports,
    processes,
    reachability,
    slurm,
    versions,
)

CHECKS: tuple[Check, ...] = (
    Check("node-reachable", "every node answers over SSH and runs the training Python",
          reachability.check_node_reachable),
    Check("torch-parity", "the same torch release and build on every node", versions.check_torch_parity),
    Check("python-parity", "the same Python version on every node", versions.check_python_parity),
    Check("code-parity", "the same training code (git commit and changes, or file hashes) on every node",
          versions.check_code_parity),
    Check("address-family", "Gloo binds one address family on every node, and not loopback",
          network.check_address_family),
    Check("interface-choice", "the interface each node reaches the master on, and the GLOO_SOCKET_IFNAME to pin it",
          network.check_interface_choice),
    Check("master-port", "the master port is free on the master, or who holds it", processes.check_master_port),
    Check("stale-processes", "no leftover training or torchrun processes on any node", processes.check_stale_processes),
    Check("data-shards", "the same data shard files, with the same content, on every node",
          data_shards.check_data_shards),
    Check("device-dtype", "the backend fits the device; a GPU beside a CPU run, or bf16 without bf16 instructions",
          hardware.check_device_dtype),
    Check("ranks-per-node", "each node has a core for every rank it is asked to start", hardware.check_ranks_per_node),
    Check("omp-threads", "OMP_NUM_THREADS x processes per node against the physical cores", hardware.check_omp_threads),
    Check("gpu-visible", "for a CUDA run, each node's ranks against the GPUs they will see; how the GPUs connect",
          gpu.check_gpu_visible),
    Check("nccl-parity", "the same NCCL and CUDA runtime on every node, and a driver new enough for torch's CUDA",
          nccl.check_nccl_parity),
    Check("gpu-memory-held", "no other process holds memory on the GPUs the ranks will use", gpu.check_gpu_memory_held),
    Check("gpu-health", "no uncorrected ECC errors or pending repairs, no slowdown, PCIe and NVLink at full width",
          gpu.check_gpu_health),
    Check("nccl-env", "NCCL_SOCKET_IFNAME and NCCL_IB_HCA name what each node has; one network and the same "
          "NCCL switches on every node", nccl.check_nccl_env),
    Check("ptrace", "hangwatch will be able to read the ranks' Python stacks", processes.check_ptrace),
    Check("clock-skew", "node clocks agree within a second or two", clock.check_clock_skew),
    Check("launch-args", "torchrun's options and the script's options do not collide", launch_args.check_launch_args),
    Check("training-imports", "each node's training Python has torch and finds every module the training command "
          "imports, from where the launch starts", imports.check_training_imports),
    Check("slurm-allocation", "inside a Slurm job: every node is the job's, with a CPU for each rank and, on GPU "
          "runs, a GPU for each rank (GRES)", slurm.check_slurm_allocation),
    Check("slurm-time-left", "inside a Slurm job: the time left before Slurm ends it", slurm.check_slurm_time_left),
    Check("master-reachable", "every worker opens a TCP connection to the master's address and port",
          ports.check_master_reachable, needs=("network",)),
    Check("ephemeral-ports", "every node accepts new connections on its ephemeral ports from every other node "
          "(Gloo's listeners), in both directions, and from itself with several ranks per node",
          ports.check_ephemeral_ports, needs=("network",)),
    Check("path-mtu", "the largest packet that passes between every pair of nodes, don't-fragment, against "
          "their interfaces' MTU (a hop that drops large packets hangs the first large collective)",
          path_mtu.check_path_mtu, needs=("path-mtu",)),
    Check("collectives", "the collectives training uses work over the real backend (a measured matrix)",
          collectives.check_collectives, needs=("collectives",)),
    Check("bandwidth", "all_reduce latency and bus bandwidth between the nodes; communication time per step",
          bandwidth.check_bandwidth, needs=("bandwidth", "path-mtu")),
    Check("compute-balance", "a short matmul benchmark per node: the straggler every step waits for",
          bandwidth.check_compute_balance, needs=("compute",)),
)

BY_ID = {c.id: c for c in CHECKS}
FACT_CHECKS = tuple(c for c in CHECKS if not c.needs)    # judged from facts alone, no probes


class UnknownCheck(ValueError):
    pass


def select(only: Iterable[str] | None) -> tuple[Check, ...]:
    if not only:
        return CHECKS
    wanted = list(only)
    unknown = [c for c in wanted if c not in BY_ID]
    if unknown:
        raise UnknownCheck(f"unknown check {', '.join(unknown)}: see --list")
    return tuple(BY_ID[c] for c in wanted)


def run_checks(ctx: Context, checks: Iterable[Check]) -> list[Result]:
    """Every check isolated: an exception becomes an error result with the reason. Each verdict
    becomes a result with its check's id."""
    results: list[Result] = []
    for check in checks:
        try:
            results.extend(Result(check.id, v.status, v.node, v.summary, text_of(v.fix), v.details, v.fix)
                           for v in check.run(ctx))
        except Exception as exc:
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            results.append(Result(check.id, Status.ERROR, None,
                                  f"the check failed: {type(exc).__name__}: {exc}",
                                  "please report this with the --json output",
                                  {"at": f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"}))
    return results
