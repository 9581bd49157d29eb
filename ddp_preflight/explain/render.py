"""An explanation as text or JSON: renders, decides nothing. The text shows what the inputs said
(file names, function names, messages, op names) written out by node/terminal.py, never obeyed;
the JSON keeps them as they were (JSON escapes them). Both lose their secrets (node/redact.py, as
the launcher's lines and files do): a NODE.log keeps a rank's lines as it printed them. The verdict's lines are rendered here from
its fields (hangwatch/text.py takes a message's first line) and each is then shown as one line."""

from __future__ import annotations

import json

from ddp_preflight.hangwatch import text
from ddp_preflight.hangwatch.model import Certainty
from ddp_preflight.hangwatch.words import cause_line, evidence_line
from ddp_preflight.node.redact import redact_json, redact_text
from ddp_preflight.node.terminal import shown, shown_text

from .finding_text import finding_line
from .verdict import Explanation


def as_json(e: Explanation) -> str:
    """The explanation's fields, and the verdict's sentence rendered from them ("summary")."""
    return json.dumps(redact_json(_data(e)), indent=2)


def _data(e: Explanation) -> dict:
    data = e.to_json()
    if e.diagnosis is not None:
        data["diagnosis"]["summary"] = text.summary(e.diagnosis)
    data["runs"] = [_data(r) for r in e.runs]
    return data      # what the inputs quoted loses its secrets, as the launcher's


def as_text(e: Explanation) -> str:
    if e.runs:
        lines = [f"{len(e.runs)} separate runs (their logs name different stores, world sizes or days): "
                 "each explained alone"]
        for number, run in enumerate(e.runs, 1):
            lines += ["", f"run {number}: {', '.join(shown(p) for p in run.read)}"]
            lines += ["  " + line for line in as_text(run).rstrip("\n").splitlines()]
        return "\n".join(lines) + "\n"
    d = e.diagnosis
    if d is None and e.finding is not None:
        lines = [shown(finding_line(e.finding))]
        if e.quotes:
            lines += ["", "the lines it rests on:"] + [f"  {shown(str(q))}" for q in e.quotes]
        if e.stopped:       # the stop's own words (a death signal) with what the watcher saw
            lines.insert(1, _watched_stop(e.stopped))
        if e.fix:
            lines += ["", f"fix: {shown(e.fix.text())}"]
    elif d is None:
        lines = [f"no failure found in {len(e.read)} input{'s' if len(e.read) != 1 else ''}: no rank raised, was "
                 "killed or lost a peer, and no launcher failed"]
        if e.stopped:
            lines.append(_watched_stop(e.stopped))
    else:
        verdict = f"{d.kind.value} ({d.certainty.value}): {shown(text.summary(d))}"
        if e.finding is not None and d.certainty is Certainty.UNSURE and not d.culprits:
            # the ends name no one for sure: what the failure's own words show comes first
            lines = [shown(finding_line(e.finding)), f"how the ranks ended: {verdict}"]
        elif e.finding is not None:
            lines = [verdict, f"the failure's own words: {shown(finding_line(e.finding))}"]
        else:
            lines = [verdict]
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


def _watched_stop(stopped: str) -> str:
    return (f"the launch was stopped ({shown(stopped)}) while hangwatch watched it, and it named no hang: ranks a "
            "collective apart in the Flight Recorders kept at the stop were in flight")
