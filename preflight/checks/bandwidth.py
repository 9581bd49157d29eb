"""bandwidth and compute-balance (to be built)."""

from __future__ import annotations

from collections.abc import Iterator

from ..model import Context, Result
from .common import probe_data


def check_bandwidth(ctx: Context) -> Iterator[Result]:
    data, early = probe_data(ctx, "bandwidth", "bandwidth")
    if early:
        yield early


def check_compute_balance(ctx: Context) -> Iterator[Result]:
    data, early = probe_data(ctx, "compute", "compute-balance")
    if early:
        yield early
