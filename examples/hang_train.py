"""A small DDP training loop (Gloo, CPU) that can be made to hang the ways real runs do.

    torchrun ... examples/hang_train.py --steps 200 [--fault KIND --rank R --at STEP]

faults:
  leave     rank R leaves the loop at step STEP (uneven data): the others wait in all_reduce
  mismatch  rank R calls all_gather at step STEP while the others call all_reduce
  straggle  rank R computes for --seconds (default 30) at step STEP, then goes on: not a hang
  exit      rank R exits with code 3 at step STEP
  quit      rank R leaves the loop at step STEP and exits cleanly (code 0) while the others train
  endless   rank R loops for ever at step STEP (a data loader that never ends), computing
  child     rank R starts two children that inherit its RANK (a Python one and a shell one, as
            torch.compile's workers and their compilers do), then leaves the loop
  skip-init rank R never calls init_process_group (it sleeps, as behind a condition): the others
            wait in it
  alone     no rank creates a process group (nanochat on CPU without its Gloo patch): each trains
            its own model
  raise     rank R raises RuntimeError at step STEP (an uncaught exception)
  kill      rank R kills itself with SIGKILL at step STEP
  stop      rank R stops itself with SIGSTOP at step STEP (a debugger's or a scheduler's suspend):
            it stays stopped until SIGCONT or SIGKILL
  stuck     rank R blocks for ever on a lock at step STEP, inside its loop, outside any collective
  loader    batches come from a DataLoader with one worker; rank R's worker blocks for ever on the
            batch of step STEP: rank R waits for its data while the others wait in all_reduce
  shell     a healthy run: at step STEP rank R starts a long-lived helper through a shell that
            inherits its environment (RANK included), as subprocess(..., shell=True) does; nothing
            is wrong
  recv      at step STEP every rank receives from the next one (a cycle of receives): nobody sends
  drained   rank R runs out of batches at step STEP and waits in its final dist.barrier() while the
            others still call all_reduce (uneven data, as it really ends)
  sleep     rank R sleeps for --seconds (default 30) at step STEP, inside its loop, before its next
            collective (a stall in time.sleep); with --pg-timeout shorter than that, the others'
            collectives time out first (a timeout cascade)
  subgroup  ranks 0,1 also all_reduce on a subgroup (new_group([0, 1])) each step; from step STEP
            rank R (0 or 1) skips it: the other waits in the subgroup's all_reduce, rank R and the
            ranks outside the group in the default group's (DDP's gradients)
--wait {blocking,work,future}: each step also all_reduces a metric: blocking, or with async_op=True
and then work.wait() inside a wrapper (the seed's _AsyncWorkWrapper) or get_future().wait(): a
rank that waits there waits in C++ under the script's own frame.
It prints "step N loss X" lines, and "FAULT <kind> rank R step N at <epoch seconds>" when the
fault starts, so a test can time how long naming it takes."""

import argparse
import datetime
import gc
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist


def arguments():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--fault", choices=["leave", "mismatch", "straggle", "exit", "quit", "endless", "child",
                                        "skip-init", "alone", "raise", "kill", "stop", "stuck", "loader", "shell",
                                        "recv", "subgroup", "sleep", "drained"])
    p.add_argument("--wait", choices=["blocking", "work", "future"], help="a metric all_reduce each step")
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--at", type=int, default=5)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--step-time", type=float, default=0.05, help="compute per step, seconds")
    p.add_argument("--width", type=int, default=256, help="the model's width: its forward/backward's share of a step")
    p.add_argument("--flight", action="store_true", help="opt in to hangwatch's Flight Recorder fetch")
    p.add_argument("--pg-timeout", type=float, default=600.0, help="init_process_group's timeout, seconds")
    return p.parse_args()


def fault_starts(kind, rank, step):
    print(f"FAULT {kind} rank {rank} step {step} at {time.time():.3f}", flush=True)


def compute(seconds):
    """Burn CPU for about `seconds`, the way a forward/backward does."""
    a = torch.randn(128, 128)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        a = torch.tanh(a @ a)
    return a


class _AsyncWorkWrapper:
    """The seed's shim (000): wait() on a Gloo work handle, where get_future() is missing."""

    def __init__(self, work):
        self._work = work

    def wait(self):
        self._work.wait()
        return None


def metric(style):
    """An all_reduce of a step metric, waited for the way the style says."""
    value = torch.ones(1)
    if style == "blocking":
        dist.all_reduce(value)
    elif style == "work":
        _AsyncWorkWrapper(dist.all_reduce(value, async_op=True)).wait()
    else:
        dist.all_reduce(value, async_op=True).get_future().wait()
    return value


def endless_batches():
    """A data loader that never ends: it cycles over too few batches, computing as it goes."""
    while True:
        compute(0.05)


def helpers_that_inherit_rank():
    """Children with this rank's environment (RANK included), as compile workers and compilers are."""
    import subprocess
    return [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(7200)"]),
            subprocess.Popen(["sh", "-c", "sleep 3600"])]


class Batches(torch.utils.data.Dataset):
    """Random batches; on the rank that is told to, the item of one step never comes (its worker
    blocks: a network file system that hangs, a lock taken before fork)."""

    def __init__(self, steps, hang_at=None, width=256):
        self.steps, self.hang_at, self.width = steps, hang_at, width

    def __len__(self):
        return self.steps

    def __getitem__(self, index):
        if index == self.hang_at:
            time.sleep(7200)
        return torch.randn(32, self.width)


def batches(args, rank):
    """Where each step's batch comes from: a DataLoader with one worker under the loader fault."""
    if args.fault != "loader":
        return (torch.randn(32, args.width) for _ in range(args.steps))
    hang_at = args.at if rank == args.rank else None
    loader = torch.utils.data.DataLoader(Batches(args.steps, hang_at, args.width), batch_size=None, num_workers=1)
    return iter(loader)


def train_step(model, optimizer, batch):
    loss = model(batch).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def main():
    args = arguments()
    rank = int(os.environ["RANK"])
    if args.fault == "skip-init" and rank == args.rank:
        fault_starts(args.fault, rank, 0)
        time.sleep(5400)                                 # anything but init_process_group
        return
    alone = args.fault == "alone"
    if args.flight:
        import ddp_preflight.hangwatch.flight  # noqa: F401  (before the process group: it sets TORCH_FR_BUFFER_SIZE)
    if not alone:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.pg_timeout))
    torch.manual_seed(0)
    layer = torch.nn.Linear(args.width, args.width)
    model = layer if alone else torch.nn.parallel.DistributedDataParallel(layer)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    mine = args.fault and rank == args.rank
    # Every rank creates the subgroup (new_group must be called by all), only its members use it.
    subgroup = dist.new_group([0, 1]) if args.fault == "subgroup" else None
    data = batches(args, rank)
    helper = None
    finished = False
    for step in range(args.steps):
        if args.fault == "recv" and step == args.at:
            if mine:
                fault_starts(args.fault, rank, step)
            dist.recv(torch.zeros(4), src=(rank + 1) % dist.get_world_size())     # everyone receives, nobody sends
        if mine and step == args.at and args.fault == "loader":
            fault_starts(args.fault, rank, step)         # the main process asks for the batch its worker never brings
        if subgroup is not None and rank in (0, 1):
            if mine and step == args.at:
                fault_starts(args.fault, rank, step)
            if not (mine and step >= args.at):
                dist.all_reduce(torch.ones(4), group=subgroup)      # rank R skips it from step STEP
        if mine and step == args.at and args.fault not in ("recv", "loader", "subgroup"):
            fault_starts(args.fault, rank, step)
            if args.fault in ("leave", "drained"):
                break                                    # uneven data: this rank ran out of batches
            if args.fault == "mismatch":
                out = [torch.zeros(4) for _ in range(dist.get_world_size())]
                dist.all_gather(out, torch.ones(4))      # the others are in all_reduce
            if args.fault == "straggle":
                compute(args.seconds)
            if args.fault == "sleep":
                time.sleep(args.seconds)                 # no CPU, inside the loop, outside any collective
            if args.fault == "exit":
                sys.exit(3)
            if args.fault == "raise":
                raise RuntimeError(f"bad batch at step {step}")
            if args.fault == "quit":
                break                                    # out of batches: it finishes, cleanly
            if args.fault == "endless":
                endless_batches()
            if args.fault == "child":
                helpers_that_inherit_rank()
                break
            if args.fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if args.fault == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            if args.fault == "stuck":
                lock = threading.Lock()
                lock.acquire()
                lock.acquire()                           # a lock nobody releases
            if args.fault == "shell":
                import subprocess
                # "; true": the shell stays the helper's parent (a lone command it would exec in place).
                helper = subprocess.Popen(f"{sys.executable} -c 'import time; time.sleep(600)'; true", shell=True)
        if args.wait:
            metric(args.wait)
        compute(args.step_time)
        loss = train_step(model, optimizer, next(data))
        if rank == 0 or os.environ.get("ALL_RANKS_PRINT"):
            print(f"step {step} loss {loss:.4f}", flush=True)
    else:
        finished = True                                  # every step trained: no break
    if mine and args.fault == "drained":
        dist.barrier()                                   # the end of its loop: the others are still in theirs
    if mine and args.fault in ("leave", "child"):
        time.sleep(3600)                                 # evaluation, saving: anything but the loop
    if helper is not None:                               # the helper the shell runs, then the shell
        os.system(f"pkill -KILL -P {helper.pid} 2>/dev/null")
        helper.kill()
        helper.wait()
    if not alone:
        if finished:
            # A healthy run must end as one. Seen on the lab (3 of 21 runs, more under hangwatch): a
            # rank aborts after "done" (`terminate called without an active exception`, SIGABRT),
            # the process group torn down at interpreter exit, still held by DDP, while its peers
            # close their connections. So: everyone is past the last collective, and DDP lets go
            # of the group before it is destroyed.
            dist.barrier()
            del model, optimizer
            gc.collect()
        dist.destroy_process_group()
    print("done", flush=True)


if __name__ == "__main__":
    main()
