"""An explanation as text or JSON: renders, decides nothing. The text shows what the inputs said
(file names, function names, messages, op names) written out by node/terminal.py, never obeyed;
the JSON keeps them as they were (JSON escapes them). The verdict's lines are rendered from the
raw fields (hangwatch/text.py takes a message's first line) and each is then shown as one line."""

from __future__ import annotations

import json

from hangwatch import text
from node.terminal import shown, shown_text

from .verdict import Explanation


def as_json(e: Explanation) -> str:
    return json.dumps(e.to_json(), indent=2)


def as_text(e: Explanation) -> str:
    d = e.diagnosis
    if d is None:
        lines = [f"no failure found in {len(e.read)} input{'s' if len(e.read) != 1 else ''}: no rank raised, was "
                 "killed or lost a peer, and no launcher failed"]
    else:
        lines = [f"{d.kind.value} ({d.certainty.value}): {shown(d.summary)}"]
        if e.quotes:
            lines.append("")
            lines.append("the lines it rests on:")
            lines += [f"  {shown(str(q))}" for q in e.quotes]
        if d.causes:
            lines.append("")
            lines.append("likely cause" + ("s" if len(d.causes) > 1 else "") + ":")
            lines += [f"  - {shown(c)}" for c in d.causes]
        if e.fix:
            lines.append("")
            lines.append(f"fix: {shown(e.fix)}")
        if d.evidence:
            lines.append("")
            lines.append("every rank:")
            lines += [f"  {shown(text.evidence_line(ev))}" + (f"\n      {shown(ev.quote)}" if ev.quote else "")
                      for ev in d.evidence]
    for skipped in e.skipped:
        lines.append(f"not read: {shown(skipped)}")
    return shown_text("\n".join(lines) + "\n")
