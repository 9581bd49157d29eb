"""Runs ON a node, in every rank under torchrun (`-m ddp_preflight.node.jobs.collectives`, the package's zip on
PYTHONPATH; torch and the standard library only): create the process group, then try each collective training uses, in
three modes and three dtypes, and print one marked JSON line per outcome.

Options: --backend gloo|nccl, --device cpu|cuda, --timeout SECONDS (the process group's: each
collective, and each wait inside its creation), --bound SECONDS (the whole creation), --ifnames
JSON (the socket interface per node rank, "" for none: to run as the nodes are set up rather
than with the interface preflight chose).

Every rank prints its own lines; a rank that raises records the backend's own message and goes
on. A failed case may leave the ranks out of step (one raised, another still waits for it), so
after one a small all_reduce tests the group, and a broken group stops the run (reported)
rather than hanging it."""

import argparse
import datetime
import json
import math
import os
import re
import sys
import threading
import time
import warnings

import torch
import torch.distributed as dist

from ddp_preflight.node import protocol, signing
from ddp_preflight.node.jobs import signed_store
from ddp_preflight.node.protocol import COLLECTIVES as MARKER

DTYPES = ("float32", "bfloat16", "float16")
MODES = ("sync", "async_wait", "async_future")
N = 4      # elements per rank: small, the point is whether it works


def emit(**fields):
    protocol.emit(MARKER, fields)


def first_line(exc):
    """The backend's own message, without the C++ stack torch appends or its source path. NCCL
    says what went wrong after its first line ("Last error:", then "Duplicate GPU detected :
    ..."): that line is kept."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    for marker in ("Exception raised from", "(most recent call first)"):
        text = text.split(marker)[0].strip()
    text = re.sub(r"\[[^\]\s]*/([^/\]\s]+:\d+)\]", r"[\1]", text)    # [/__w/.../pair.cc:555] -> [pair.cc:555]
    if "Last error:" in lines[1:-1]:
        text += "; Last error: " + lines[lines.index("Last error:") + 1]
    return (text or type(exc).__name__)[:400]


class Wrong(Exception):
    """The call returned, but the numbers are not what every rank sent."""


# Each operation: (rank, world, dtype, device, async_op) -> (works, check).
# works: what async_op=True returned (a Work, or a list for point-to-point); check() raises Wrong.
def _full(value, dtype, device, n=N):
    return torch.full((n,), float(value), dtype=dtype, device=device)


def _sent(value, dtype):
    """A value as a rank sends it: rounded to the dtype (the small integers here are exact)."""
    return float(torch.tensor(float(value), dtype=dtype))


# How far a reduction may come back from the exact result, relative to it. Rounding to nearest
# is off by at most u = eps/2 of the result: 2^-8 in bfloat16, 2^-11 in float16, 2^-24 in
# float32. A sum of W terms takes W-1 additions, in whatever order the backend picks (a ring,
# a tree, each chunk of the tensor in its own order: at 16 ranks Gloo's bfloat16 reduce_scatter
# returns 380 for 376 on one rank, 346 and 348 for 344 on another), and for every order
# |computed - exact| <= gamma(W-1) * sum(|x_i|), gamma(k) = k*u / (1 - k*u) (Higham, Accuracy
# and Stability of Numerical Algorithms, 2nd ed., 4.2). AVG's division and PREMUL_SUM's scaling
# round once more: gamma(W). Every rank sends positive values here, so sum(|x_i|) is the exact
# result and the bound is relative: about (W-1)*u, 6.2% for 16 bfloat16 ranks, 14% for 32.
# A sum of integers whose total the dtype holds exactly (up to 2/eps: 256 in bfloat16, 2048 in
# float16, 2^24 in float32) does not round at all: every partial sum, in any order, is an
# integer no larger than the total. There the result must be exact, so a missing rank or
# another rank's shard is caught in every dtype; beyond it, float32's rows still catch them,
# and the low-precision rows catch what is off by more than the rounding can explain.
def reduction_tolerance(dtype, roundings, integer_total=None):
    eps = torch.finfo(dtype).eps
    if integer_total is not None and integer_total <= 2 / eps:
        return 0.0
    k = roundings * eps / 2
    return k / (1 - k) if k < 1 else math.inf


def expected_reduction(op, rank, world, dtype):
    """The exact result of a reduction on this rank, and its tolerance (relative). Rank r sends
    r+1 to the all_reduces, and r+1+j for shard j to the reduce_scatters."""
    if op.startswith("reduce_scatter"):
        total = sum(_sent(r + 1 + rank, dtype) for r in range(world))
        return total, reduction_tolerance(dtype, world - 1, total)
    total = sum(_sent(r + 1, dtype) for r in range(world))
    if op == "all_reduce_sum":
        return total, reduction_tolerance(dtype, world - 1, total)
    return total / (world if op == "all_reduce_avg" else 2), reduction_tolerance(dtype, world)


def within(got, want, rtol=0.0):
    """Whether got is want (a tensor, or one number for every element) to within rtol of it:
    0 for copies, which never round. Compared in float64, where these values are exact."""
    got = got.double().cpu()
    want = want.double().cpu() if torch.is_tensor(want) else torch.full_like(got, want)
    return got.shape == want.shape and bool(((got - want).abs() <= rtol * want.abs()).all())


def _expect(got, want, rtol=0.0):
    if not within(got, want, rtol):
        shown = want.float().tolist()[:8] if torch.is_tensor(want) else [want] * min(len(got), 8)
        raise Wrong(f"got {got.float().tolist()[:8]}, expected {shown}" + (f" (within {rtol:.2%})" if rtol else ""))


def _expect_reduced(t, op, rank, world, dtype):
    _expect(t, *expected_reduction(op, rank, world, dtype))


def all_reduce_sum(rank, world, dtype, device, async_op):
    t = _full(rank + 1, dtype, device)
    work = dist.all_reduce(t, op=dist.ReduceOp.SUM, async_op=async_op)
    return work, lambda: _expect_reduced(t, "all_reduce_sum", rank, world, dtype)


def all_reduce_avg(rank, world, dtype, device, async_op):
    t = _full(rank + 1, dtype, device)
    work = dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=async_op)
    return work, lambda: _expect_reduced(t, "all_reduce_avg", rank, world, dtype)


def all_reduce_premul_sum(rank, world, dtype, device, async_op):
    # NCCL's pre-scaled sum: gradient averaging done inside the reduction.
    t = _full(rank + 1, dtype, device)
    work = dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5), async_op=async_op)
    return work, lambda: _expect_reduced(t, "all_reduce_premul_sum", rank, world, dtype)


def reduce_scatter_tensor(rank, world, dtype, device, async_op):
    inp = torch.cat([_full(rank + 1 + j, dtype, device) for j in range(world)])
    out = torch.empty(N, dtype=dtype, device=device)
    work = dist.reduce_scatter_tensor(out, inp, async_op=async_op)
    return work, lambda: _expect_reduced(out, "reduce_scatter_tensor", rank, world, dtype)


def reduce_scatter(rank, world, dtype, device, async_op):
    # The list form seed 000's optimizer calls: dist.reduce_scatter(out, [shard, ...]).
    inputs = [_full(rank + 1 + j, dtype, device) for j in range(world)]
    out = torch.empty(N, dtype=dtype, device=device)
    work = dist.reduce_scatter(out, inputs, async_op=async_op)
    return work, lambda: _expect_reduced(out, "reduce_scatter", rank, world, dtype)


def all_gather(rank, world, dtype, device, async_op):
    outs = [torch.empty(N, dtype=dtype, device=device) for _ in range(world)]
    work = dist.all_gather(outs, _full(rank + 1, dtype, device), async_op=async_op)

    def check():
        for j, got in enumerate(outs):
            _expect(got, _full(j + 1, dtype, device))
    return work, check


def all_gather_into_tensor(rank, world, dtype, device, async_op):
    out = torch.empty(world * N, dtype=dtype, device=device)
    work = dist.all_gather_into_tensor(out, _full(rank + 1, dtype, device), async_op=async_op)
    return work, lambda: _expect(out, torch.cat([_full(j + 1, dtype, device) for j in range(world)]))


def all_gather_uneven(rank, world, dtype, device, async_op):
    # Rank r sends r+1 elements: the last shard of a tensor that does not divide evenly.
    outs = [torch.empty(j + 1, dtype=dtype, device=device) for j in range(world)]
    work = dist.all_gather(outs, _full(rank + 1, dtype, device, rank + 1), async_op=async_op)

    def check():
        for j, got in enumerate(outs):
            _expect(got, _full(j + 1, dtype, device, j + 1))
    return work, check


def broadcast(rank, world, dtype, device, async_op):
    t = _full(7 if rank == 0 else 0, dtype, device)
    work = dist.broadcast(t, src=0, async_op=async_op)
    return work, lambda: _expect(t, _full(7, dtype, device))


def barrier(rank, world, dtype, device, async_op):
    return dist.barrier(async_op=async_op), lambda: None


def isend_irecv(rank, world, dtype, device, async_op):
    # A ring: send to the next rank, receive from the previous one.
    send, recv = _full(rank + 1, dtype, device), torch.empty(N, dtype=dtype, device=device)
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    def check():
        _expect(recv, _full(prev + 1, dtype, device))
    if not async_op:
        # Blocking send/recv in an order that cannot deadlock: even ranks send first.
        if rank % 2 == 0:
            dist.send(send, nxt)
            dist.recv(recv, prev)
        else:
            dist.recv(recv, prev)
            dist.send(send, nxt)
        return None, check
    return [dist.isend(send, nxt), dist.irecv(recv, prev)], check


def all_to_all_single(rank, world, dtype, device, async_op):
    inp = torch.cat([_full(rank * world + j, dtype, device) for j in range(world)])
    out = torch.empty(world * N, dtype=dtype, device=device)
    work = dist.all_to_all_single(out, inp, async_op=async_op)
    return work, lambda: _expect(out, torch.cat([_full(j * world + rank, dtype, device) for j in range(world)]))


OPS = {
    "all_reduce_sum": all_reduce_sum,
    "all_reduce_avg": all_reduce_avg,
    "reduce_scatter_tensor": reduce_scatter_tensor,
    "reduce_scatter": reduce_scatter,
    "all_gather_into_tensor": all_gather_into_tensor,
    "all_gather": all_gather,
    "all_gather_uneven": all_gather_uneven,
    "broadcast": broadcast,
    "barrier": barrier,
    "isend_irecv": isend_irecv,
    "all_to_all_single": all_to_all_single,
    "all_reduce_premul_sum": all_reduce_premul_sum,
}


def plan():
    cases = []
    for op in OPS:
        for dtype in (None,) if op == "barrier" else DTYPES:
            for mode in MODES:
                cases.append((op, mode, dtype))
    return cases


def run_case(op, mode, dtype, rank, world, device):
    """Returns a deprecation notice or None; raises Wrong for wrong numbers, anything else
    is the backend's own error."""
    torch_dtype = getattr(torch, dtype) if dtype else torch.float32
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        works, check = OPS[op](rank, world, torch_dtype, device, mode != "sync")
    deprecated = next((str(w.message).splitlines()[0] for w in caught
                       if issubclass(w.category, (FutureWarning, DeprecationWarning))), None)
    works = works if isinstance(works, list) else [works] if works is not None else []
    if mode == "async_wait":
        for w in works:
            w.wait()
    elif mode == "async_future":
        try:
            for w in works:
                w.get_future().wait()
        except BaseException:
            # The operation is in flight on every rank: finish it, or the next case would meet it.
            for w in works:
                try:
                    w.wait()
                except Exception:
                    pass
            raise
    check()
    return deprecated


def agree(store, i, rank, failed, world, timeout):
    """Whether every rank reached the end of case i, and how many of them failed it.

    Over the rendezvous store, not the backend: it works even when the group does not. Each rank
    sets a key of its own (signed, as every value: a counter could not be), and reads them all."""
    keys = [f"case/{i}/{r}" for r in range(world)]
    store.set(keys[rank], "1" if failed else "0")
    try:
        store.wait(keys, timeout)
    except Exception:
        return None
    return sum(value == b"1" for value in store.multi_get(keys))


def healthy(world, device):
    try:
        t = torch.ones(1, device=device)
        dist.all_reduce(t)
        return int(t.item()) == world
    except Exception:
        return False


def main(prefix=None):
    """`prefix`: the store keys of its group go under it (in a launched rank, node/jobs/probes.py's
    in_rank: the training's own group, made after, must never read them)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--bound", type=float, default=15.0)
    parser.add_argument("--ifnames")
    args = parser.parse_args()
    if args.ifnames is not None:
        var = "NCCL_SOCKET_IFNAME" if args.backend == "nccl" else "GLOO_SOCKET_IFNAME"
        value = json.loads(args.ifnames)[int(os.environ.get("GROUP_RANK", "0"))]
        if value:
            os.environ[var] = value
        else:
            os.environ.pop(var, None)     # the backend picks, as it would for a hand-started run
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    timeout = datetime.timedelta(seconds=args.timeout)
    device = torch.device("cuda", local_rank) if args.device == "cuda" else torch.device("cpu")
    started = time.monotonic()

    def give_up():
        # Gloo keeps retrying a connection that a firewall drops for five times its timeout;
        # the probe stops at its own bound and says so, rather than wait for that.
        emit(event="init", rank=rank, ok=False, timed_out=True, seconds=round(time.monotonic() - started, 3),
             error=f"process-group creation did not finish within {args.bound:g} s", host=os.uname().nodename)
        os._exit(2)
    watchdog = threading.Timer(args.bound, give_up)
    watchdog.daemon = True
    watchdog.start()
    try:
        if device.type == "cuda":
            torch.cuda.set_device(device)     # inside: no GPU is this rank's reported failure
        # torchrun's store, every value signed (a stranger's write ends the job: "interfered").
        store = signed_store.rank_store(timeout)
        dist.init_process_group(args.backend, store=dist.PrefixStore(prefix, store) if prefix else store, rank=rank,
                                world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)
        world = dist.get_world_size()
        # A first collective: Gloo connects its pairs here, NCCL builds its communicator.
        t = torch.ones(1, device=device)
        dist.all_reduce(t)
        watchdog.cancel()
    except Exception as exc:
        watchdog.cancel()
        signed_store.stop_if_interfered(f"rank {rank}")
        emit(event="init", rank=rank, ok=False, seconds=round(time.monotonic() - started, 3),
             error_type=type(exc).__name__, error=first_line(exc), host=os.uname().nodename)
        os._exit(1)      # no destroy: a half-made group can block in it
    emit(event="init", rank=rank, ok=True, seconds=round(time.monotonic() - started, 3), world=world,
         host=os.uname().nodename, torch=torch.__version__, backend=args.backend, device=str(device))
    cases = plan()
    if rank == 0:
        emit(event="plan", cases=[list(c) for c in cases])
    store = dist.distributed_c10d._get_default_store()
    wait = datetime.timedelta(seconds=args.timeout + 5)   # a stuck peer gives up at its own timeout
    for i, (op, mode, dtype) in enumerate(cases):
        t0 = time.monotonic()
        outcome = {"status": "ok"}
        try:
            deprecated = run_case(op, mode, dtype, rank, world, device)
            if deprecated:
                outcome["deprecated"] = deprecated
        except Wrong as exc:
            outcome = {"status": "wrong", "error": str(exc)}
        except Exception as exc:
            outcome = {"status": "error", "error_type": type(exc).__name__, "error": first_line(exc)}
        signed_store.stop_if_interfered(f"rank {rank}")      # NCCL reads the store in a first collective
        emit(event="case", rank=rank, i=i, op=op, mode=mode, dtype=dtype,
             seconds=round(time.monotonic() - t0, 4), **outcome)
        try:
            failed = agree(store, i, rank, outcome["status"] != "ok", world, wait)
        except signed_store.Interfered:
            signed_store.stop_if_interfered(f"rank {rank}")
        if failed is None:
            emit(event="broken", rank=rank, after=i, reason="another rank did not finish this case")
            os._exit(3)
        # A clean refusal (an operation the backend lacks) leaves the group usable; a timeout,
        # or a rank that raised alone, does not: every later case would fail for that reason.
        if failed and not healthy(world, device):
            emit(event="broken", rank=rank, after=i,
                 reason=f"{failed} of {world} ranks failed this case, and the group no longer all-reduces")
            os._exit(3)
    emit(event="done", rank=rank, seconds=round(time.monotonic() - started, 3))
    try:
        dist.destroy_process_group()
    except Exception:
        pass


if __name__ == "__main__":
    signing.key_from_environment()
    main()
    # Its group is closed and its lines are out: the teardown with torch loaded measures nothing,
    # and torchrun waits for it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
