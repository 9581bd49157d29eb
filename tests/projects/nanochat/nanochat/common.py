"""
Common utilities for nanochat (the shape of nanochat/common.py: see ../README.md).
"""

import logging
import os

import torch
import torch.distributed as dist
from filelock import FileLock  # noqa: F401  (nanochat's download_file_with_lock)

logger = logging.getLogger(__name__)


def print0(s="", **kwargs):
    if int(os.environ.get("RANK", 0)) == 0:
        print(s, **kwargs)


def get_base_dir():
    return os.environ.get("NANOCHAT_BASE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "nanochat"))


def is_ddp_requested() -> bool:
    """True if launched by torchrun (env present), even before init."""
    return all(k in os.environ for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))


def is_ddp_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_dist_info():
    if is_ddp_requested():
        return True, int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    return False, 0, 0, 1


def autodetect_device_type():
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    print0(f"Autodetected device type: {device_type}")
    return device_type


def compute_init(device_type="cuda"):  # cuda|cpu|mps
    """Basic initialization that we keep doing over and over, so make common."""
    assert device_type in ["cuda", "mps", "cpu"], "Invalid device type atm"
    torch.manual_seed(42)
    # Distributed setup: Distributed Data Parallel (DDP), optional, and requires CUDA
    is_ddp_requested, ddp_rank, ddp_local_rank, ddp_world_size = get_dist_info()
    if is_ddp_requested and device_type == "cuda":
        device = torch.device("cuda", ddp_local_rank)
        torch.cuda.set_device(device)  # make "cuda" default to this device
        dist.init_process_group(backend="nccl", device_id=device)
        dist.barrier()
    else:
        device = torch.device(device_type)  # mps|cpu
    if ddp_rank == 0:
        logger.info(f"Distributed world size: {ddp_world_size}")
    return is_ddp_requested, ddp_rank, ddp_local_rank, ddp_world_size, device


def compute_cleanup():
    """Companion function to compute_init, to clean things up before script exit"""
    if is_ddp_initialized():
        dist.destroy_process_group()
