"""An explanation as text or JSON: renders, decides nothing. The text shows what the inputs said
(file names, function names, messages, op names) written out by node/terminal.py, never obeyed;
the JSON keeps them as they were (JSON escapes them). Both lose their secrets (node/redact.py, as
the launcher's lines and files do): a NODE.log keeps a rank's lines as it printed them. The verdict's lines are rendered here from
its fields (hangwatch/text.py takes a message's first line) and each is then shown as one line."""

from __future__ import annotations

import json

from hangwatch import text
from hangwatch.words import cause_line, evidence_line
from node.redact import redact_json, redact_text
from node.terminal import shown, shown_text

from .verdict import Explanation


def as_json(e: Explanation) -> str:
    """The explanation's fields, and the verdict's sentence rendered from them ("summary")."""
    data = e.to_json()
    if e.diagnosis is not None:
        data["diagnosis"]["summary"] = text.summary(e.diagnosis)
    return json.dumps(redact_json(data), indent=2)      # what the inputs quoted loses its secrets, as the launcher's


def as_text(e: Explanation) -> str:
    d = e.diagnosis
    if d is None:
        lines = [f"no failure found in {len(e.read)} input{'s' if len(e.read) != 1 else ''}: no rank raised, was "
                 "killed or lost a peer, and no launcher failed"]
    else:
        lines = [f"{d.kind.value} ({d.certainty.value}): {shown(text.summary(d))}"]
        if e.saved:
            lines.append("(the verdict ddp-preflight --launch saved in result.json, decided while the run was watched)")
        if e.quotes:
            lines.append("")
            lines.append("the lines it rests on:")
            lines += [f"  {shown(str(q))}" for q in e.quotes]
        if d.causes:
            lines.append("")
            lines.append("likely cause" + ("s" if len(d.causes) > 1 else "") + ":")
            lines += [f"  - {shown(cause_line(c))}" for c in d.causes]
        if e.fix:
            lines.append("")
            lines.append(f"fix: {shown(e.fix.text())}")
        if d.evidence:
            lines.append("")
            lines.append("every rank:")
            lines += [f"  {shown(evidence_line(ev))}" + (f"\n      {shown(ev.quote)}" if ev.quote else "")
                      for ev in d.evidence]
    for skipped in e.skipped:
        lines.append(f"not read: {shown(skipped)}")
    return shown_text(redact_text("\n".join(lines) + "\n"))     # the launcher's redaction, node/redact.py
