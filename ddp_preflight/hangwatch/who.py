"""Who a verdict names: a rank by its number, or, when its number is not known, by what is known
of it (Unnumbered), never by a made-up number."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Union


@functools.total_ordering
@dataclass(frozen=True, eq=True)
class Unnumbered:
    """A rank whose number is not known (its RANK unread, two processes that claim one, a log's
    writer that never said it): named by what is known of it, never by a made-up number. It
    sorts after every numbered rank."""
    node: str | None = None
    pid: int | None = None            # its process, where one was seen
    writer: str | None = None         # where explain read it, when no process was seen ("local rank 0 of worker1.log")

    def __lt__(self, other: object) -> bool:
        if isinstance(other, int):
            return False
        if isinstance(other, Unnumbered):
            return self._order() < other._order()
        return NotImplemented

    def _order(self) -> tuple:
        return (self.pid is None, self.pid or 0, self.node or "", self.writer or "")

    def __str__(self) -> str:
        if self.pid is not None:
            return f"pid {self.pid}"
        return self.writer or (f"a rank on {self.node}" if self.node else "a rank")


Who = Union[int, Unnumbered]       # a rank named by a verdict: its number, or what is known of it


def who(keys: Iterable[Who]) -> str:
    """Ranks by number; a rank whose number is unknown by its pid (or where it was read)."""
    keys = list(keys)
    numbered = sorted(r for r in keys if isinstance(r, int))
    pids = sorted(r.pid for r in keys if isinstance(r, Unnumbered) and r.pid is not None)
    parts = [("rank " if len(numbered) == 1 else "ranks ") + ",".join(map(str, numbered))] if numbered else []
    parts += [("pid " if len(pids) == 1 else "pids ") + ",".join(map(str, pids))] if pids else []
    parts += [str(r) for r in keys if isinstance(r, Unnumbered) and r.pid is None]
    return " and ".join(parts)


def label(who: Who) -> str:
    """"rank 3", or what names a rank whose number is unknown ("pid 4242")."""
    return f"rank {who}" if isinstance(who, int) else str(who)


def who_from_json(value) -> Who:
    return Unnumbered(**{k: v for k, v in value.items() if k in Unnumbered.__dataclass_fields__}) \
        if isinstance(value, dict) else int(value)
