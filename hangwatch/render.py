"""Text views of hangwatch's objects: the event stream line and the incident report.
Renderers return strings; only the CLI prints. Every value from a rank or a node (a file or
function name, an exception's message, an op name, a notice) goes through node/terminal.py here,
at the edge: the text never carries a raw control character. The verdict's own lines (its
summary, each rank's evidence line) are rendered from the raw fields by text.py, which takes
an exception message's first line, and are shown as one line each."""

from __future__ import annotations

import time

from node.terminal import shown, shown_data, shown_text

from .model import RankView, Snapshot
from .text import evidence_line, who


def event_line(kind: str, text: str, at: float | None = None) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(at if at is not None else time.time()))
    return f"{stamp} {shown(kind):<10} {shown(text)}"


def rank_line(r: RankView) -> str:
    r = shown_data(r)
    what = r.op if r.state == "collective" else r.state
    where = f" at {r.frame}" + (f" ({r.function})" if r.function else "") if r.frame else ""
    extra = f", {r.exit}" if r.exit else ""
    return (f"{r.label:<8} {r.node}:{r.pid:<8} {what}{where}; CPU {r.cpu:.0f}%, idle {r.idle_for:.0f} s"
            f"{', wchan ' + r.wchan if r.wchan else ''}{extra}")


def diagnosis_block(snapshot: Snapshot) -> str:
    d = snapshot.diagnosis
    if d is None:
        return "no hang\n"
    lines = [f"{d.kind.upper()}: {shown(d.summary)}"]
    if d.culprits:
        lines.append(f"look at: {who(d.culprits)} ({d.reason.value if d.reason else 'see above'}; {d.certainty})")
    elif d.candidates:
        lines.append(f"one of: {who(d.candidates)} (which one, the evidence cannot tell)")
    lines += [f"likely cause: {shown(c)}" for c in d.causes]
    lines += ["ranks:"] + [f"  {rank_line(r)}" for r in snapshot.ranks]
    return shown_text("\n".join(lines) + "\n")


def incident_report(snapshot: Snapshot, details: dict) -> str:
    out = [f"hangwatch incident, {time.strftime('%Y-%m-%d %H:%M:%S %Z', time.localtime(snapshot.time))}", "",
           diagnosis_block(snapshot)]
    if snapshot.diagnosis and snapshot.diagnosis.evidence:
        out += ["evidence:"] + [f"  {shown(evidence_line(e))}" for e in snapshot.diagnosis.evidence] + [""]
    snapshot, details = shown_data(snapshot), shown_data(details)
    out.append("stacks (innermost first):")
    for r in snapshot.ranks:
        out.append(f"  {r.label} on {r.node} (pid {r.pid}):")
        if r.stack:
            out += [f"    {f['file']}:{f['line']} {f['function']}" for f in r.stack]
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
