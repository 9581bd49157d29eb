"""What to call instead of a collective the backend does not implement, or computes wrongly:
collectives' fix for each failure it measured, and `ddp-preflight explain`'s for the error a
run printed (one set of workarounds for both)."""

from __future__ import annotations

from .fix import Fix, change

# The torch.distributed function behind each operation id.
CALL = {"all_reduce_sum": "all_reduce", "all_reduce_avg": "all_reduce", "all_reduce_premul_sum": "all_reduce",
        "all_gather_uneven": "all_gather", "isend_irecv": "isend"}

SHIM = "docs/checks/collectives.md#the-get_future-shim"


def workaround(op: str, modes: list[str], dtypes: list[str], backend: str) -> Fix:
    """For an operation that raises: what to call instead."""
    call = CALL.get(op, op)
    if modes == ["async_future"]:
        wrapped = "dist.isend(...)" if op == "isend_irecv" else f"dist.{call}(..., async_op=True)"
        return change(f"call it as _async_op({wrapped}): a shim that returns work.get_future() and falls back to "
                      f"an object whose wait() calls work.wait() ({SHIM})")
    if op == "all_reduce_premul_sum":
        return change("multiply first, then reduce with SUM: t.mul_(factor); dist.all_reduce(t, op=dist.ReduceOp.SUM)")
    if op == "all_gather_uneven":
        return change("pad every rank's tensor to the largest size, gather with dist.all_gather_into_tensor, then cut "
                      "each rank's part back to its own length (send the lengths first with a small all_gather)")
    if op == "all_reduce_avg":
        return change("reduce with SUM, then divide: dist.all_reduce(t); t.div_(dist.get_world_size())")
    if dtypes and "float32" not in dtypes:
        return change(f"communicate in float32: t32 = t.float(); dist.{call}(t32, ...); t.copy_(t32)")
    if modes == ["async_wait", "async_future"]:
        return change(f"call dist.{call} without async_op=True on {backend}")
    return change(f"{backend} does not implement it here: avoid this call, or use a backend that does (nccl on GPUs)")


def wrong_numbers(op: str, modes: list[str], dtypes: list[str], backend: str) -> Fix:
    """For an operation that returns, but further from the exact result than rounding explains."""
    call = CALL.get(op, op)
    if dtypes and "float32" not in dtypes:
        return change(f"communicate in float32: t32 = t.float(); dist.{call}(t32, ...); t.copy_(t32)")
    if "sync" not in modes:
        return change(f"call dist.{call} without async_op=True on {backend}")
    return change(f"{backend} computes dist.{call} wrongly here, in float32 too: avoid it on this backend and report "
                  "it to the backend's developers with the --json output")
