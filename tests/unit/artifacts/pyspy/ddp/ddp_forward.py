"""Two ranks on loopback (Gloo, CPU): a DDP model with a buffer (BatchNorm), so its forward
broadcasts buffers (_sync_buffers). From step 3 rank 1 sleeps before its forward; rank 0 waits
in DDP's forward."""
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn

dist.init_process_group("gloo")
rank = dist.get_rank()
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1000):
    if rank == 1 and step == 3:
        time.sleep(600)
    loss = model(torch.randn(4, 8)).sum()
    loss.backward()
    opt.step()
    print(f"step {step}", flush=True)
