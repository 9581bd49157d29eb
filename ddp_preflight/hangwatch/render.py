"""Views of hangwatch's objects at the edge: an event's line, the JSON the CLI prints and the
bundle keeps (a verdict's fields, with its words added), the diagnosis block and the incident
report. Renderers return strings (or JSON-ready dicts); only the CLI prints. Every value from a
rank or a node (a file or function name, an exception's message, an op name, a notice) goes
through node/terminal.py here, at the edge: the text never carries a raw control character. The
verdict's own lines (its summary, each rank's evidence line) are rendered from the raw fields by
text.py and words.py, which take an exception message's first line, and are shown as one line
each."""

from __future__ import annotations

import time

from ddp_preflight.node.terminal import shown, shown_data, shown_text

from .events import Event, EventKind
from .model import Diagnosis, RankView, Snapshot
from .stacks import group_stacks
from .text import summary
from .words import cause_line, evidence_line, who


def event_text(event: Event) -> str:
    """An event's line: a verdict's words from its fields ("DEADLOCK: rank 3 left the loop ..."
    for a hang), ranks that connected after all, or the notice as it was said."""
    if event.verdict is not None:
        said = summary(event.verdict)
        return f"{event.verdict.kind.value.upper()}: {said}" if event.kind is EventKind.DIAGNOSIS else said
    if event.connected:
        return f"{who(event.connected)} connected after all: a process group was created late"
    return event.text


def diagnosis_json(d: Diagnosis) -> dict:
    """A verdict as the JSON contract holds it: its fields, and its words (`summary`)."""
    return {**d.to_json(), "summary": summary(d)}


def snapshot_json(snapshot: Snapshot) -> dict:
    """A snapshot as the JSON contract holds it (`hangwatch attach --json`, incident.json)."""
    document = snapshot.to_json()
    if snapshot.diagnosis is not None:
        document["diagnosis"] = diagnosis_json(snapshot.diagnosis)
    return document


def event_line(kind: str, text: str, at: float | None = None) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(at if at is not None else time.time()))
    return f"{stamp} {shown(kind):<10} {shown(text)}"


def rank_line(r: RankView) -> str:
    r = shown_data(r)
    what = r.op if r.state == "collective" else f"importing {r.op}" if r.state == "importing" and r.op else r.state
    where = f" at {r.frame}" + (f" ({r.function})" if r.function else "") if r.frame else ""
    extra = f", {r.exit}" if r.exit else ""
    return (f"{r.label:<8} {r.node}:{r.pid:<8} {what}{where}; CPU {r.cpu:.0f}%, idle {r.idle_for:.0f} s"
            f"{', wchan ' + r.wchan if r.wchan else ''}{extra}")


def diagnosis_block(snapshot: Snapshot) -> str:
    d = snapshot.diagnosis
    if d is None:
        return "no hang\n"
    lines = [f"{d.kind.upper()}: {shown(summary(d))}"]
    if d.culprits:
        lines.append(f"look at: {who(d.culprits)} ({d.reason.value if d.reason else 'see above'}; {d.certainty})")
    elif d.candidates:
        lines.append(f"one of: {who(d.candidates)} (which one, the evidence cannot tell)")
    lines += [f"likely cause: {shown(cause_line(c))}" for c in d.causes]
    lines += ["ranks:"] + [f"  {rank_line(r)}" for r in snapshot.ranks]
    return shown_text("\n".join(lines) + "\n")


def incident_report(snapshot: Snapshot, details: dict) -> str:
    out = [f"hangwatch incident, {time.strftime('%Y-%m-%d %H:%M:%S %Z', time.localtime(snapshot.time))}", "",
           diagnosis_block(snapshot)]
    if snapshot.diagnosis and snapshot.diagnosis.evidence:
        out += ["evidence:"] + [f"  {shown(evidence_line(e))}" for e in snapshot.diagnosis.evidence] + [""]
    snapshot, details = shown_data(snapshot), shown_data(details)
    # Ranks that do the same thing read once (stacks.group_stacks: Python frames and named native
    # functions, not the addresses that differ per process); each rank's pid beside it.
    out.append("stacks (innermost first; ranks with the same stack together):")
    by_key = {r.key: r for r in snapshot.ranks}
    for group in group_stacks(snapshot.ranks):
        members = ", ".join(f"{by_key[k].label} on {by_key[k].node} (pid {by_key[k].pid})" for k in group.ranks)
        out.append(f"  {members}{' (differs)' if group.differs else ''}:")
        if group.stack:
            out += [f"    {f['file']}:{f['line']} {f['function']}" for f in group.stack]
        else:
            out.append("    (no stack)")
    out += ["", "CPU history (% of a core, oldest first):"]
    out += [f"  {r.label}: {' '.join(f'{c:.0f}' for c in r.history)}" for r in snapshot.ranks]
    out += ["", "nodes:"]
    for name, hello in sorted((details.get("nodes") or {}).items()):
        out.append(f"  {name}: host {hello.get('host')}, Python {hello.get('python')}, torch {hello.get('torch')}, "
                   f"py-spy {hello.get('py_spy') or 'missing'}")
    out += ["", "environment (secrets redacted):"]
    for key, rank in sorted((details.get("ranks") or {}).items()):
        out.append(f"  {key}: {' '.join(rank.get('argv') or [])}")
        for k, v in sorted((rank.get("env") or {}).items()):
            out.append(f"    {k}={v}")
    if snapshot.messages:
        out += ["", "notices:"] + [f"  {m}" for m in snapshot.messages]
    return shown_text("\n".join(out) + "\n")        # and whatever a value above brought
