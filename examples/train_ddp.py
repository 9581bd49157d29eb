"""A tiny DDP training run over Gloo: a linear model on random data, one "step N loss X" line
per step and rank. For learning launches on the lab and for ddp-preflight's own launch tests.

    ddp-preflight master worker1 --launch --nproc-per-node 2 -- examples/train_ddp.py --steps 50

Options of its own: --steps N, --step-time SECONDS (sleep per step, so a run lasts), and
--fail-rank R [--fail-step S] [--fail-code C] (rank R exits with code C at step S, to see what a
failed rank does to the others). Options it does not know are printed, not rejected: that shows
which options reached the script rather than torchrun. PG_TIMEOUT bounds process-group creation."""

import argparse
import datetime
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser(allow_abbrev=False)
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--step-time", type=float, default=0.0)
parser.add_argument("--fail-rank", type=int)
parser.add_argument("--fail-step", type=int, default=3)
parser.add_argument("--fail-code", type=int, default=3)
args, others = parser.parse_known_args()

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("PG_TIMEOUT", "60"))))
rank, world = dist.get_rank(), dist.get_world_size()
print(f"rank {rank} of {world} on {socket.gethostname()} (pid {os.getpid()}); options {sys.argv[1:]}; "
      f"not mine {others}", flush=True)

torch.manual_seed(0)                       # the same initial weights everywhere (DDP checks it)
model = DDP(torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.Generator().manual_seed(rank)   # each rank its own batches
for step in range(args.steps):
    if rank == args.fail_rank and step == args.fail_step:
        print(f"rank {rank} exits with code {args.fail_code} on purpose (--fail-rank)", file=sys.stderr, flush=True)
        sys.exit(args.fail_code)
    x = torch.randn(32, 16, generator=data)
    loss = F.mse_loss(model(x), x.sum(dim=1, keepdim=True))
    optimizer.zero_grad()
    loss.backward()                        # the all_reduce of the gradients happens here
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}", flush=True)
    if args.step_time:
        time.sleep(args.step_time)
dist.barrier()                             # leave together: a rank tearing down its connections
dist.destroy_process_group()               # while a peer still uses them can abort the peer
