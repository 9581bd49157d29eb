"""The checks: one explicit table. Each is a pure function of all nodes' facts."""

from __future__ import annotations

import traceback
from collections.abc import Iterable

from ..model import Check, Context, Result, Status
from .bandwidth import check_bandwidth, check_compute_balance
from .clock import check_clock_skew
from .collectives import check_collectives
from .data_shards import check_data_shards
from .gpu import check_gpu_health, check_gpu_memory_held, check_gpu_visible
from .hardware import check_device_dtype, check_omp_threads, check_ranks_per_node
from .launch_args import check_launch_args
from .nccl import check_nccl_env, check_nccl_parity
from .network import check_address_family, check_interface_choice
from .ports import check_ephemeral_ports, check_master_reachable
from .processes import check_master_port, check_ptrace, check_stale_processes
from .reachability import check_node_reachable
from .versions import check_code_parity, check_python_parity, check_torch_parity

CHECKS: tuple[Check, ...] = (
    Check("node-reachable", "every node answers over SSH and runs the training Python", check_node_reachable),
    Check("torch-parity", "the same torch release and build on every node", check_torch_parity),
    Check("python-parity", "the same Python version on every node", check_python_parity),
    Check("code-parity", "the same training code (git commit and changes, or file hashes) on every node", check_code_parity),
    Check("address-family", "Gloo binds one address family on every node, and not loopback", check_address_family),
    Check("interface-choice", "the interface each node reaches the master on, and the GLOO_SOCKET_IFNAME to pin it", check_interface_choice),
    Check("master-port", "the master port is free on the master, or who holds it", check_master_port),
    Check("stale-processes", "no leftover training or torchrun processes on any node", check_stale_processes),
    Check("data-shards", "the same data shard files, with the same content, on every node", check_data_shards),
    Check("device-dtype", "the backend fits the device; a GPU beside a CPU run, or bf16 without bf16 instructions", check_device_dtype),
    Check("ranks-per-node", "each node has a core for every rank it is asked to start", check_ranks_per_node),
    Check("omp-threads", "OMP_NUM_THREADS x processes per node against the physical cores", check_omp_threads),
    Check("gpu-visible", "for a CUDA run, each node's ranks against the GPUs they will see; how the GPUs connect",
          check_gpu_visible),
    Check("nccl-parity", "the same NCCL and CUDA runtime on every node, and a driver new enough for torch's CUDA",
          check_nccl_parity),
    Check("gpu-memory-held", "no other process holds memory on the GPUs the ranks will use", check_gpu_memory_held),
    Check("gpu-health", "no uncorrected ECC errors or pending repairs, no slowdown, PCIe and NVLink at full width",
          check_gpu_health),
    Check("nccl-env", "NCCL_SOCKET_IFNAME and NCCL_IB_HCA name what each node has; one network and the same "
          "NCCL switches on every node", check_nccl_env),
    Check("ptrace", "hangwatch will be able to read the ranks' Python stacks", check_ptrace),
    Check("clock-skew", "node clocks agree within a second or two", check_clock_skew),
    Check("launch-args", "torchrun's options and the script's options do not collide", check_launch_args),
    Check("master-reachable", "every worker opens a TCP connection to the master's address and port",
          check_master_reachable, needs=("network",)),
    Check("ephemeral-ports", "every node accepts new connections on its ephemeral ports from every other node "
          "(Gloo's listeners), in both directions", check_ephemeral_ports, needs=("network",)),
    Check("collectives", "the collectives training uses work over the real backend (a measured matrix)",
          check_collectives, needs=("collectives",)),
    Check("bandwidth", "all_reduce latency and bus bandwidth between the nodes; communication time per step",
          check_bandwidth, needs=("bandwidth",)),
    Check("compute-balance", "a short matmul benchmark per node: the straggler every step waits for",
          check_compute_balance, needs=("compute",)),
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
    """Every check isolated: an exception becomes an error result with the reason."""
    results: list[Result] = []
    for check in checks:
        try:
            results.extend(check.run(ctx))
        except Exception as exc:
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            results.append(Result(check.id, Status.ERROR, None,
                                  f"the check failed: {type(exc).__name__}: {exc}",
                                  "please report this with the --json output",
                                  {"at": f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"}))
    return results
