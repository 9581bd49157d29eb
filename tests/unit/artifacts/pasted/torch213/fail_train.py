"""A two-rank Gloo job that fails one way (argv[1]), for record.py: real torch 2.13 output of each
failure kind explain reads, recorded on this box."""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

mode = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(4)
dist.all_reduce(t)                       # every rank is up and connected
if mode == "mismatch":                   # under TORCH_DISTRIBUTED_DEBUG=DETAIL
    dist.all_reduce(t) if rank == 0 else dist.broadcast(t, src=0)
elif mode == "unsupported":
    out = torch.zeros(2)
    dist.reduce_scatter_tensor(out, torch.ones(4))
elif rank == 1:
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif mode == "abort":
        os.kill(os.getpid(), signal.SIGABRT)
    elif mode == "raise":
        raise KeyError("img_r1")
    elif mode == "exit":
        sys.exit(3)
else:
    time.sleep(120)                      # rank 0 ends only by torchrun's stop: rank 1's failure is the first
dist.destroy_process_group()
