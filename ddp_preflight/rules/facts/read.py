"""Reading the nodes' JSON: `Missing`, the readers that name the key they could not read,
and `Sent` for values kept as the node sent them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Missing:
    """Why a section (or a part of one) is not there. Always false, so `if not x` reads as
    "missing" too; prefer isinstance(x, Missing) where x may be empty."""
    reason: str                  # one line, as the node or the parser said it
    failed: bool = False         # the node sent an error in its place (False: it sent nothing)
    absent: bool | None = None   # the node says what was asked for is not there (no torch, no
    #                              such folder): True; there but unreadable: False; not said: None
    path: str | None = None      # the folder it is about, when the node named one

    def __bool__(self) -> Literal[False]:
        return False


class Unreadable(ValueError):
    """A section lacks a key it cannot do without, or has a value of the wrong kind."""


# --- reading values: each names the key it could not read ----------------------------------

def kind(wire: Mapping[str, Any], key: str, kinds: tuple[type, ...], what: str) -> Any:
    """wire[key] when it is one of `kinds` (true or false only where bool is one); None when
    absent or null; Unreadable when it is something else."""
    value = wire.get(key)
    if value is None or (isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)):
        return value
    raise Unreadable(f"{key} is not {what} ({type(value).__name__})")


def present(wire: Mapping[str, Any], key: str) -> Any:
    """wire[key], which may be null, but must be there."""
    if key not in wire:
        raise Unreadable(f"no {key}")
    return wire[key]


def text(wire: Mapping[str, Any], key: str) -> str | None:
    return kind(wire, key, (str,), "text")


def whole(wire: Mapping[str, Any], key: str) -> int | None:
    return kind(wire, key, (int,), "a whole number")


def number(wire: Mapping[str, Any], key: str) -> float | None:
    value = kind(wire, key, (int, float), "a number")
    return None if value is None else float(value)


def flag(wire: Mapping[str, Any], key: str) -> bool:
    """A yes/no value; absent or null is no."""
    return bool(kind(wire, key, (bool,), "true or false"))


def texts(wire: Mapping[str, Any], key: str) -> tuple[str, ...]:
    """A list of strings; absent or null is empty."""
    value = kind(wire, key, (list, tuple), "a list") or ()
    if not all(isinstance(v, str) for v in value):
        raise Unreadable(f"{key} is not a list of text")
    return tuple(value)


def strings(wire: Mapping[str, Any], key: str) -> Mapping[str, str]:
    """An object of string values (absent or null: empty), read-only."""
    value = kind(wire, key, (Mapping,), "an object") or {}
    if not all(isinstance(v, str) for v in value.values()):
        raise Unreadable(f"{key} has values that are not text")
    return MappingProxyType(dict(value))


def objects(wire: Mapping[str, Any], key: str, parse: Callable[[Mapping[str, Any]], T]) -> tuple[T, ...]:
    """A list of objects, each parsed; absent or null is empty."""
    value = kind(wire, key, (list, tuple), "a list") or ()
    if not all(isinstance(v, Mapping) for v in value):
        raise Unreadable(f"{key} is not a list of objects")
    return tuple(parse(v) for v in value)


def required(value: T | None, key: str) -> T:
    """A value the section cannot do without: absent or null makes it unreadable."""
    if value is None:
        raise Unreadable(f"no {key}")
    return value


def part(wire: Mapping[str, Any], key: str, parse: Callable[[Mapping[str, Any]], T],
         absent: str | None = None) -> T | Missing:
    """An object inside a section, parsed; or Missing with the reason. `absent`: the reason when
    the key is not there or null (default: "no KEY facts were collected")."""
    value = wire.get(key)
    if value is None:
        return Missing(absent or f"no {key} facts were collected")
    if not isinstance(value, Mapping):
        return Missing(f"the {key} facts could not be read: not an object ({type(value).__name__})", failed=True)
    try:
        return parse(value)
    except (Unreadable, ValueError, TypeError, KeyError) as exc:   # one bad section, not the node
        return Missing(f"the {key} facts could not be read: {exc}", failed=True)


def section(wire: Mapping[str, Any], key: str, parse: Callable[[Mapping[str, Any]], T]) -> T | Missing:
    """A collector's section, parsed; or Missing: the error the node sent in its place, or why
    it could not be read, or that none was sent."""
    value = wire.get(key)
    if isinstance(value, Mapping) and "error" in value:
        return Missing(str(value["error"]), failed=True,
                       absent=value.get("missing") if isinstance(value.get("missing"), bool) else None,
                       path=value.get("dir") if isinstance(value.get("dir"), str) else None)
    return part(wire, key, parse)


@dataclass(frozen=True)
class Sent:
    """The JSON object the node sent for this value, for the report's details."""
    sent: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False, kw_only=True)

    def to_json(self) -> dict:
        return dict(self.sent)


def sent_of(wire: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(wire))
