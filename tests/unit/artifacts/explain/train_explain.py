"""A small Gloo training loop (CPU) that fails the ways the explain corpus needs beyond
examples/hang_train.py and ../logs/train_faults.py.

    torchrun ... train_explain.py --fault getfuture|large|uneven|none [--rank R] [--timeout S] [--mb N]

faults:
  getfuture  every rank overlaps its gradient reduction as seed 000's optimizer does:
             dist.reduce_scatter_tensor(..., async_op=True).get_future(): Gloo raises
             "Work::getFuture not implemented"
  large      every rank all_reduces one N MB tensor (--mb) with the process group's timeout at
             --timeout seconds: over a slow link (the lab's wifi fault) it times out
  uneven     rank R has fewer batches than the others (its shard is short): it leaves the loop
             and waits at its end (a save, an evaluation that never comes), the others wait for it
             in their next all_reduce for ever (seeds 001, 004)
  none       trains --steps steps"""

import argparse
import datetime
import time

import torch
import torch.distributed as dist


def arguments():
    p = argparse.ArgumentParser()
    p.add_argument("--fault", choices=["getfuture", "large", "uneven", "none"], default="none")
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--mb", type=int, default=64)
    p.add_argument("--timeout", type=float, default=600.0, help="the process group's timeout, seconds")
    return p.parse_args()


def batches(rank, args):
    """This rank's shard: rank R's is short under --fault uneven."""
    count = args.steps // 3 if args.fault == "uneven" and rank == args.rank else args.steps
    for _ in range(count):
        yield torch.randn(32, 64)


def main():
    args = arguments()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if args.fault == "large":
        big = torch.ones(args.mb * (1 << 20) // 4)
        print(f"rank {rank}: all_reduce of {args.mb} MB at {time.time():.3f}", flush=True)
        dist.all_reduce(big)
    for step, batch in enumerate(batches(rank, args)):
        loss = model(batch).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():
            if args.fault == "getfuture":
                flat = p.grad.reshape(-1)
                out = torch.empty(flat.numel() // world)
                dist.reduce_scatter_tensor(out, flat[:out.numel() * world], async_op=True).get_future().wait()
            dist.all_reduce(p.grad)
            p.grad /= world
        optimizer.step()
        time.sleep(0.05)
        print(f"step {step} loss {loss.item():.4f}", flush=True)
    print(f"rank {rank}: out of batches after {step + 1} steps", flush=True)
    if args.fault == "uneven":
        time.sleep(3600)   # what comes after the loop (a save, an evaluation) waits for the others
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
