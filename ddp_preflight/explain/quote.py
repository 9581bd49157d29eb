"""A line an explanation rests on, as file:line: text."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Quote:
    path: str
    line: int | None          # None: a JSON document's field, not a line
    text: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line is not None else self.path
        return f"{where}: {self.text.strip()[:300]}"
