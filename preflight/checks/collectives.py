"""collectives: the operations training uses, tried over the real backend (to be built)."""

from __future__ import annotations

from collections.abc import Iterator

from ..model import Context, Result
from .common import probe_data


def check_collectives(ctx: Context) -> Iterator[Result]:
    data, early = probe_data(ctx, "collectives", "collectives")
    if early:
        yield early
