"""Text from a rank or a file made harmless for a terminal: shown, never obeyed.

One rule for every string that reaches a terminal or a report (the launcher's lines and summary,
`hangwatch attach`, the dashboard, `explain`, the preflight table, report.txt): a control
character or an escape sequence in it is written out, the way `cat -v` does (ESC as ^[, BEL as
^G, the C1 introducer 0x9b as M-^[), so that a file name, a function name, an exception message
or an op name cannot retitle the window, clear the screen, move the cursor or rewrite a line the
tool printed. Standard library only: the nodes and the master use the same rule. JSON keeps the
raw values (JSON escapes them); only text is written out.

- `shown(value)`: a value inside a line; its line breaks too are written out (^J, ^M), so one
  value never becomes two lines;
- `shown_text(text)`: a rendered text of several lines; its own line breaks stay;
- `visible(line)`: a rank's output line; a carriage return keeps what a terminal would have
  shown (a progress bar's last state);
- `shown_data(value)`: a dataclass, dict, list or tuple with every string in it through `shown`,
  for the renderers that build their lines from a snapshot, a verdict or a result."""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Mapping

# What a terminal would obey rather than show: the C0 controls (the tab aside, which only moves
# the cursor to the next stop), DEL and the C1 controls (0x9b starts an escape sequence on its
# own). Also the Unicode line and paragraph separators (str.splitlines() breaks a line at them)
# and the bidirectional overrides and isolates, which reorder what a terminal draws.
_BREAKS = "\u2028\u2029\u202a-\u202e\u2066-\u2069"
CONTROL = re.compile(f"[\x00-\x08\x0a-\x1f\x7f-\x9f{_BREAKS}]")
CONTROL_BUT_NEWLINE = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BREAKS}]")


def shown(value: str) -> str:
    """A value from a rank, a node or a file, for the middle of a line: every control character
    written out, line breaks too ("a\\nb" is shown as "a^Jb")."""
    if CONTROL.search(value) is None:           # nearly always: no copy
        return value
    return CONTROL.sub(_written_out, value)


def shown_text(text: str) -> str:
    """A rendered text of several lines (a report, a summary): its line breaks stay, every other
    control character is written out."""
    if CONTROL_BUT_NEWLINE.search(text) is None:
        return text
    return CONTROL_BUT_NEWLINE.sub(_written_out, text)


def visible(line: str) -> str:
    """A rank's output line as it may reach a terminal: a carriage return keeps what a terminal
    would have left (a progress bar's last state), the rest is written out as `shown` does."""
    if "\r" in line:
        line = next((part for part in reversed(line.split("\r")) if part), "")
    return shown(line)


def shown_data(value):
    """`value` with every string in it (dataclass fields, mapping keys and values, list and tuple
    items) through `shown`; enums and numbers as they are. What holds no control character is
    returned as it is, not copied."""
    if isinstance(value, enum.Enum):              # a str enum is a closed word, never data
        return value
    if isinstance(value, str):
        return shown(value)
    if isinstance(value, Mapping):
        pairs = [(shown_data(k), shown_data(v)) for k, v in value.items()]
        if all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(pairs, value.items())):
            return value
        return type(value)(pairs) if isinstance(value, dict) else dict(pairs)
    if isinstance(value, (list, tuple)):
        items = [shown_data(item) for item in value]
        if all(new is old for new, old in zip(items, value)):
            return value
        if isinstance(value, tuple) and hasattr(value, "_fields"):    # a named tuple
            return type(value)(*items)
        return type(value)(items)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changed = {}
        for f in dataclasses.fields(value):
            if f.init:
                old = getattr(value, f.name)
                new = shown_data(old)
                if new is not old:
                    changed[f.name] = new
        return dataclasses.replace(value, **changed) if changed else value
    return value


def _written_out(found: re.Match) -> str:
    code = ord(found.group(0))
    if code == 0x7F:
        return "^?"
    if code > 0x9F:                                # a Unicode separator or direction mark
        return f"<U+{code:04X}>"
    if code >= 0x80:
        return "M-^" + chr(code - 0x80 + 0x40)
    return "^" + chr(code + 0x40)
