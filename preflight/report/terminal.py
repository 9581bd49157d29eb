"""A rank's text made harmless for a terminal: what the launcher's stream and the dashboard show."""

from __future__ import annotations

import re

# What a terminal would obey rather than show: C0 controls but the tab, DEL, and the C1 controls
# (0x9b is an escape sequence's start on its own).
CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def visible(line: str) -> str:
    """A rank's line as it may reach a terminal: shown, never obeyed. A carriage return keeps what
    a terminal would have left (a progress bar's last state); other control characters and escape
    sequences are written out the way `cat -v` does (ESC as ^[, 0x9b as M-^[); tabs stay."""
    if "\r" in line:
        line = next((part for part in reversed(line.split("\r")) if part), "")
    return CONTROL.sub(_caret, line)


def _caret(found: re.Match) -> str:
    code = ord(found.group(0))
    if code == 0x7F:
        return "^?"
    if code >= 0x80:
        return "M-^" + chr(code - 0x80 + 0x40)
    return "^" + chr(code + 0x40)
