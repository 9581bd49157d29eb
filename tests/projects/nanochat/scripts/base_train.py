"""
Train model. From root directory of the project, run as:

python -m scripts.base_train

or distributed as:

torchrun --nproc_per_node=8 -m scripts.base_train

(nanochat's own words; the shape of scripts/base_train.py, see ../README.md)
"""

import argparse

import torch
import torch.distributed as dist
import wandb  # noqa: F401
from nanochat.common import compute_cleanup, compute_init, is_ddp_initialized
from nanochat.dataloader import batches
from nanochat.gpt import GPT
from nanochat.tokenizer import get_tokenizer
from scripts.base_eval import evaluate_core

parser = argparse.ArgumentParser(description="Pretrain base model")
parser.add_argument("--device-type", type=str, default="cpu", help="cuda|cpu|mps")
parser.add_argument("--num-iterations", type=int, default=3)
args = parser.parse_args()

ddp, ddp_rank, ddp_local_rank, ddp_world_size, device = compute_init(args.device_type)
get_tokenizer()
model = GPT(8)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x in batches(args.num_iterations, 4, 8):
    loss = model(x)
    loss.backward()
    if is_ddp_initialized():
        # As nanochat's optimizer does: every rank's gradients averaged.
        for p in model.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
    optimizer.step()
    optimizer.zero_grad()
# What each rank ended with: the same weights on every rank only when they trained together.
weights = torch.cat([p.detach().flatten() for p in model.parameters()])
print(f"rank {ddp_rank}: step {args.num_iterations} in a group of "
      f"{dist.get_world_size() if is_ddp_initialized() else 1}, weights {weights.sum().item():.6f}", flush=True)
evaluate_core(model)
compute_cleanup()
