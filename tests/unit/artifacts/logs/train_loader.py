"""A small Gloo training loop (CPU) whose rank R's DataLoader worker fails, for record.py.

    torchrun ... train_loader.py [--rank R] [--at STEP]

Rank R's dataset raises in its DataLoader worker at step STEP (a truncated shard): the main
process raises "Caught ValueError in DataLoader worker process 0." with the worker's traceback
inside its message. At exit, an object's __del__ fails: Python prints "Exception ignored in: ..."
and that traceback after the uncaught one. The other ranks lose their peer."""

import argparse
import datetime

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

BATCH = 8


class Shards(Dataset):
    def __init__(self, bad_sample):
        self.bad_sample = bad_sample

    def __len__(self):
        return 1000

    def __getitem__(self, index):
        if index == self.bad_sample:
            raise ValueError(f"shard for sample {index} is truncated")
        return torch.randn(64)


class MetricsFile:
    """Closed twice: the second close, in __del__ at exit, fails."""

    def __del__(self):
        raise OSError("metrics.jsonl is already closed")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--at", type=int, default=5)
    args = p.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    metrics = MetricsFile()  # noqa: F841 (alive until exit)
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    bad = args.at * BATCH if rank == args.rank else -1
    loader = DataLoader(Shards(bad), batch_size=BATCH, num_workers=1)
    for step, batch in enumerate(loader):
        loss = model(batch).pow(2).mean()
        loss.backward()
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
