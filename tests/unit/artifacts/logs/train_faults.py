"""A small Gloo training loop (CPU) that fails the ways record.py needs beyond examples/hang_train.py.

    torchrun ... train_faults.py --fault chained|sleep|size|none [--rank R] [--at STEP] [--timeout S]

faults:
  chained  rank R fails while handling a KeyError ("During handling of the above exception"); the
           others catch the Gloo error of their all_reduce and raise their own ValueError from it
           ("The above exception was the direct cause")
  sleep    rank R sleeps 3 x --timeout at step STEP: the others' collective times out (Gloo's
           timeout is --timeout, given to init_process_group)
  size     rank R all_reduces a larger buffer at step STEP than the others' gradients: the Gloo
           transport thread of the rank that receives the longer message aborts ("terminate
           called after throwing an instance of 'gloo::EnforceNotMet'")
  none     trains until stopped (record.py breaks the link under it)"""

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist


def arguments():
    p = argparse.ArgumentParser()
    p.add_argument("--fault", choices=["chained", "sleep", "size", "none"], default="none")
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--at", type=int, default=5)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--timeout", type=float, default=600.0, help="the process group's timeout, seconds")
    return p.parse_args()


CACHE = {step: torch.randn(32, 64) for step in range(5)}       # too few batches cached


def batch_for(step):
    try:
        return CACHE[step]
    except KeyError:
        raise RuntimeError(f"batch {step} is not in the cache")  # noqa: B904 (the chain is the point)


def sync_gradients(model, step):
    """Average the gradients by hand, as a small trainer does; a failure says which step."""
    for p in model.parameters():
        try:
            dist.all_reduce(p.grad)
        except RuntimeError as exc:
            raise ValueError(f"gradient sync failed at step {step}") from exc
        p.grad /= dist.get_world_size()


def main():
    args = arguments()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        mine = rank == args.rank and step == args.at and args.fault != "none"
        if mine:
            print(f"FAULT {args.fault} rank {rank} step {step} at {time.time():.3f}", flush=True)
        if mine and args.fault == "sleep":
            time.sleep(3 * args.timeout)
        if mine and args.fault == "size":
            dist.all_reduce(torch.zeros(64 * 64 + 4096))     # a buffer not trimmed to the gradient's size
        batch = batch_for(step) if args.fault == "chained" and mine else torch.randn(32, 64)
        loss = model(batch).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        sync_gradients(model, step)
        optimizer.step()
        time.sleep(0.05)
        if rank == 0 or os.environ.get("ALL_RANKS_PRINT"):
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()
    print("done", flush=True)


if __name__ == "__main__":
    main()
