"""A tiny DDP job for the attach tests (tests/lab/test_attach_lab.py), started by hand with
torchrun as a user does. Every rank trains small steps over Gloo until the test says go (a file
it creates once hangwatch has found every rank: rank 0 looks, and an all_reduce tells everyone at
the same step), so nothing the test asserts depends on how fast anything starts. Then:
- no --fault: a few more steps, and every rank exits 0;
- --fault segv: the --rank ranks crash with SIGSEGV (a NULL read through ctypes);
- --fault memory: they raise MemoryError (an allocation Python cannot make);
- --fault value: they raise ValueError (give two ranks: both raise at the same step).
The others go on into the next all_reduce and lose their peer."""

from __future__ import annotations

import argparse
import ctypes
import os
import time

import torch
import torch.distributed as dist


def arguments():
    p = argparse.ArgumentParser()
    p.add_argument("--go", required=True, help="the file whose existence starts the fault (or the end)")
    p.add_argument("--fault", choices=["segv", "memory", "value"])
    p.add_argument("--rank", default="", help="the faulty ranks, comma-separated")
    p.add_argument("--after", type=int, default=3, help="steps after go before a healthy run ends")
    p.add_argument("--spawn", type=int, default=0,
                   help="start this many ranks with torch.multiprocessing.spawn on this machine (no torchrun): "
                        "the store at 127.0.0.1:--port")
    p.add_argument("--port", type=int, default=29500)
    return p.parse_args()


def step(model, optimizer):
    loss = model(torch.randn(16, 64)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def main():
    args = arguments()
    if args.spawn:
        import torch.multiprocessing as mp
        # env:// as mp.spawn's users write it: the store's address in os.environ, the rank an argument.
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(args.port)
        mp.spawn(train, args=(args,), nprocs=args.spawn)
    else:
        train(None, args)


def train(spawned, args):
    if spawned is None:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", rank=spawned, world_size=args.spawn)
    rank = dist.get_rank()
    faulty = {int(r) for r in args.rank.split(",") if r}
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = 0
    while True:                       # train until go: every rank learns it at the same step
        step(model, optimizer)
        steps += 1
        flag = torch.tensor([1.0 if rank == 0 and os.path.exists(args.go) else 0.0])
        dist.all_reduce(flag)
        if flag.item() > 0:
            break
        time.sleep(0.05)
    if args.fault and rank in faulty:
        print(f"FAULT {args.fault} rank {rank} step {steps} at {time.time():.3f}", flush=True)
        if args.fault == "segv":
            ctypes.string_at(0)                              # SIGSEGV: a read at address 0
        if args.fault == "memory":
            bytearray(1 << 60)                               # MemoryError: more than any machine holds
        if args.fault == "value":
            raise ValueError(f"bad label at step {steps}")
    for _ in range(args.after if not args.fault else 1000):
        step(model, optimizer)
        time.sleep(0.05)
    if rank == 0:
        print(f"done after {steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
