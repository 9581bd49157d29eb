"""Slurm's compressed host lists ('node[01-03,07],gpu5') expanded without Slurm: the fallback
for where `scontrol show hostnames` cannot answer (no Slurm client here, or no configuration to
read), and the count that caps a list before Slurm is asked to expand it. Its answers are tested
against what the lab's real Slurm printed (tests/unit/artifacts/slurm/hostnames.json)."""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

from .host_names import MAX_HOSTS, HostListError, bad_host_reason


def count(hostlist: str) -> int:
    """How many names the list holds, counted without expanding it (a syntax error raises
    HostListError, saying what is wrong)."""
    return sum(_count(_parse_item(item)) for item in _split_items(hostlist))


def expand(hostlist: str) -> list[str]:
    """The names, as `scontrol show hostnames` prints them: 'node[01-03,07],gpu5' -> node01 node02
    node03 node07 gpu5; 'rack[1-2]-n[1-2]' -> rack1-n1 rack1-n2 rack2-n1 rack2-n2 (the last
    bracket varies fastest; _expand_item says the order of more). Raises HostListError for a
    list that names no usable host, or more than MAX_HOSTS (counted first: a huge range is never
    expanded), or one Slurm refuses."""
    checked(hostlist)
    texts = _split_items(hostlist)
    items = [_parse_item(item) for item in texts]
    for text, item in zip(texts, items, strict=True):
        _after_last_bracket(text, item)
    hosts = [host for item in items for host in _expand_item(item)]
    for host in hosts:
        reason = bad_host_reason(host)
        if reason:
            raise HostListError(reason)     # the caller names where the list came from
    return hosts


def checked(hostlist: str) -> int:
    """The list's count, once it is known to name at least one host and at most MAX_HOSTS."""
    total = count(hostlist)
    if total == 0:
        raise HostListError("it lists no hosts")
    if total > MAX_HOSTS:
        raise HostListError(f"it lists {total} hosts, more than the {MAX_HOSTS} ddp-preflight takes")
    return total


def _split_items(hostlist: str) -> list[str]:
    """The comma- (or space-) separated items; commas inside brackets belong to the ranges."""
    items, current, depth = [], "", 0
    for char in hostlist:
        if char == "[":
            if depth:
                raise HostListError("a '[' inside brackets: ranges do not nest")
            depth = 1
        elif char == "]":
            if not depth:
                raise HostListError("a ']' without its '['")
            depth = 0
        elif char in ", \t\n" and not depth:
            items.append(current)
            current = ""
            continue
        current += char
    if depth:
        raise HostListError("a '[' without its ']'")
    return [item for item in items + [current] if item]


@dataclass(frozen=True)
class _Bracket:
    """One bracket group: its ranges as (low, high, width); `[01-03]` keeps width 2, as Slurm
    writes it (the width of the low end)."""
    ranges: tuple[tuple[int, int, int], ...]

    def count(self) -> int:
        return sum(high - low + 1 for low, high, _ in self.ranges)

    def names(self) -> list[str]:
        return [f"{i:0{width}d}" for low, high, width in self.ranges for i in range(low, high + 1)]


_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def _parse_item(item: str) -> list[str | _Bracket]:
    """Text and bracket groups in turn: `rack[1-2]-n[01-03]` -> "rack", [1-2], "-n", [01-03]."""
    parts = re.split(r"\[([^\]]*)\]", item)      # even indexes: text; odd: inside brackets
    return [part if i % 2 == 0 else _parse_bracket(part, item) for i, part in enumerate(parts) if part or i % 2]


def _parse_bracket(inside: str, item: str) -> _Bracket:
    ranges = []
    for part in inside.split(","):
        match = _RANGE.fullmatch(part)
        if not match:
            raise HostListError(f"in {item}, {part!r} is not a number or a range of numbers like 1-4")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise HostListError(f"in {item}, the range {part} runs backwards, so it names no host")
        ranges.append((int(low), int(high), len(low)))
    return _Bracket(tuple(ranges))


def _after_last_bracket(text: str, item: list[str | _Bracket]) -> None:
    """Slurm (22.05) ends an item that has brackets with its last bracket: 'node[1-3]-ib' is
    refused there ("Invalid hostlist"), so it is here, with the reason; a name no host can have
    ('node1;x') is said first, as the plainer fault."""
    if not any(isinstance(piece, _Bracket) for piece in item) or isinstance(item[-1], _Bracket):
        return
    first = "".join(piece if isinstance(piece, str) else piece.names()[0] for piece in item)
    reason = bad_host_reason(first)
    if reason:
        raise HostListError(reason)
    raise HostListError(f"in {text}, {item[-1]!r} follows the last ']': Slurm ends a host list's item with "
                        "its bracket (write the names out, or name the nodes so the number comes last)")


def _count(item: list[str | _Bracket]) -> int:
    return math.prod(piece.count() for piece in item if isinstance(piece, _Bracket))


def _expand_item(item: list[str | _Bracket]) -> list[str]:
    """In Slurm's order: the last bracket varies fastest; before it, the first bracket, then the
    second, ... ('a[1-2]b[1-2]c[1-2]' -> a1b1c1 a1b1c2 a2b1c1 a2b1c2 a1b2c1 ..., as Slurm printed it)."""
    at = [i for i, piece in enumerate(item) if isinstance(piece, _Bracket)]
    order = [*reversed(at[:-1]), *at[-1:]]          # itertools.product varies its last list fastest
    names = []
    for values in itertools.product(*(_names_of(item[i]) for i in order)):
        chosen = dict(zip(order, values, strict=True))
        names.append("".join(chosen[i] if i in chosen else _text(piece) for i, piece in enumerate(item)))
    return names


def _names_of(piece: str | _Bracket) -> list[str]:
    return [piece] if isinstance(piece, str) else piece.names()


def _text(piece: str | _Bracket) -> str:
    return piece if isinstance(piece, str) else ""
