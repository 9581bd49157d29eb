"""A nanoGPT-shaped training script (see README.md): its DDP set-up, then a tiny model."""
import os

import torch
from torch.distributed import destroy_process_group, init_process_group

backend = "nccl"
device = "cuda"

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend=backend)
    ddp_rank = int(os.environ["RANK"])
    ddp_local_rank = int(os.environ["LOCAL_RANK"])
    ddp_world_size = int(os.environ["WORLD_SIZE"])
    # One GPU per rank: the rank's own, whatever --device said.
    #
    #
    device = f"cuda:{ddp_local_rank}"
    torch.cuda.set_device(device)
    master_process = ddp_rank == 0
else:
    master_process = True
model = torch.nn.Linear(8, 8).to(device)
if ddp:
    destroy_process_group()
