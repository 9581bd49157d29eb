"""A healthy DDP training (Gloo, CPU) whose ranks wait on each other in every way a healthy run
does, none of them a hang (issue 35): uneven step times, a slow straggler, a rank-0 checkpoint
while the others wait in barrier(), data-loader pauses, periodic evaluation. And one shape that
is no hang of the training's collectives either: a rank that reads its stdin (a pipe nobody
writes).

    torchrun ... tests/lab/soak_train.py [--minutes M | --steps N] [options]

  --uneven LO,HI          each rank's step takes a time drawn per (step, rank) in [LO, HI] s (half
                          computing, half asleep): the others wait for the slowest in all_reduce
  --straggler R --straggle S   rank R sleeps S s in every step (a slow straggler)
  --checkpoint-every K --checkpoint-seconds C   every K steps rank 0 saves for C s in
                          save_checkpoint() (asleep) while the others wait in barrier()
  --eval-every K --eval-seconds E   every K steps each rank evaluates (forward passes, then asleep
                          for a share of E s) and all_reduces its metric
  --loader-pause-every K --loader-pause P   batches from a DataLoader with one worker, which sleeps
                          P s before every K-th batch (a slow file system): its rank waits for data
  --stdin-rank R --stdin-at K   at step K rank R reads sys.stdin.readline() from a pipe nobody
                          writes (it blocks for good)

It prints "step N rank R" after each step and "FAULT <what> rank R step N at <epoch s>" when a
shape starts, and "done rank R steps N" when it finishes."""

import argparse
import datetime
import os
import random
import sys
import time

import torch
import torch.distributed as dist


def arguments():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10 ** 9)
    p.add_argument("--minutes", type=float, default=None, help="train until this long has passed (rank 0 decides)")
    p.add_argument("--uneven", default=None, help="LO,HI: each rank's step time in seconds, drawn per step")
    p.add_argument("--straggler", type=int, default=None)
    p.add_argument("--straggle", type=float, default=4.0)
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--checkpoint-seconds", type=float, default=60.0)
    p.add_argument("--eval-every", type=int, default=0)
    p.add_argument("--eval-seconds", type=float, default=3.0)
    p.add_argument("--loader-pause-every", type=int, default=0)
    p.add_argument("--loader-pause", type=float, default=4.0)
    p.add_argument("--stdin-rank", type=int, default=None)
    p.add_argument("--stdin-at", type=int, default=5)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def shape_starts(what, rank, step):
    print(f"FAULT {what} rank {rank} step {step} at {time.time():.3f}", flush=True)


class Batches(torch.utils.data.Dataset):
    """Random batches; every `every`-th one comes `pause` s late (a slow file system)."""

    def __init__(self, steps, width, every, pause):
        self.steps, self.width, self.every, self.pause = steps, width, every, pause

    def __len__(self):
        return self.steps

    def __getitem__(self, index):
        if self.every and index and index % self.every == 0:
            time.sleep(self.pause)
        return torch.randn(16, self.width)


def batches(args, steps):
    if not args.loader_pause_every:
        return (torch.randn(16, args.width) for _ in range(steps))
    data = Batches(steps, args.width, args.loader_pause_every, args.loader_pause)
    return iter(torch.utils.data.DataLoader(data, batch_size=None, num_workers=1))


def save_checkpoint(model, seconds, path):
    """Rank 0's checkpoint: slow storage, modelled as a sleep (no CPU), then the file."""
    time.sleep(seconds)
    torch.save(model.state_dict(), path)
    os.unlink(path)                                  # nothing of the run is left behind


def evaluate(model, seconds, width):
    with torch.no_grad():
        for _ in range(4):
            model(torch.randn(16, width))
    time.sleep(seconds)
    metric = torch.ones(1)
    dist.all_reduce(metric)
    return metric.item()


def busy(seconds):
    end = time.monotonic() + seconds
    x = torch.randn(32, 32)
    while time.monotonic() < end:
        x = (x @ x).tanh()


def step_time(args, step, rank):
    if not args.uneven:
        return 0.0
    lo, hi = (float(v) for v in args.uneven.split(","))
    draw = random.Random(args.seed * 1_000_003 + step * 101 + rank)
    # Mostly short steps, now and then a long one (a step with more data, a slow batch): 0.05-6 s.
    return lo if draw.random() < 0.6 else draw.uniform(lo, hi)


def main():
    args = arguments()
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    rank = dist.get_rank()
    torch.manual_seed(0)
    layer = torch.nn.Linear(args.width, args.width)
    model = torch.nn.parallel.DistributedDataParallel(layer)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = batches(args, args.steps)
    began = time.time()
    folder = os.environ.get("SOAK_CHECKPOINTS", "/tmp")
    step = 0
    for step in range(args.steps):
        if args.minutes is not None:
            more = torch.tensor([1.0 if time.time() - began < args.minutes * 60 else 0.0])
            dist.broadcast(more, 0)                      # rank 0's clock decides, for every rank at once
            if not more.item():
                break
        if args.stdin_rank == rank and step == args.stdin_at:
            read, write = os.pipe()                      # a pipe nobody writes, as its stdin
            os.dup2(read, 0)
            sys.stdin = os.fdopen(0, "r")
            shape_starts("stdin", rank, step)
            sys.stdin.readline()
        pause = step_time(args, step, rank)
        busy(pause / 2)
        time.sleep(pause / 2)
        if args.straggler == rank:
            time.sleep(args.straggle)
        batch = next(data)
        loss = model(batch).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if args.eval_every and step and step % args.eval_every == 0:
            evaluate(model, args.eval_seconds * (1 + rank) / 4, args.width)
        if args.checkpoint_every and step and step % args.checkpoint_every == 0:
            if rank == 0:
                shape_starts("checkpoint", rank, step)
                save_checkpoint(layer, args.checkpoint_seconds, os.path.join(folder, f"soak-{os.getpid()}.pt"))
            dist.barrier()
        print(f"step {step} rank {rank}", flush=True)
    print(f"done rank {rank} steps {step + 1}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
