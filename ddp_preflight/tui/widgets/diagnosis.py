"""The hang: what kind, since when, which rank and why; incident bundles and notices. What the
ranks and nodes said is shown, never obeyed (node/terminal.py); the verdict's lines are rendered
from the raw fields (text.py takes a message's first line) and shown as one line each."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from ddp_preflight.hangwatch.model import Diagnosis, Snapshot, is_hang, label
from ddp_preflight.hangwatch.text import summary
from ddp_preflight.hangwatch.words import cause_line, evidence_line, note_line, who
from ddp_preflight.node.terminal import shown, shown_data

from .. import format as fmt

HANG, MILD = "-hang", "-mild"       # the panel's border: red, or the milder colour


def colour(diagnosis: Diagnosis | None) -> str | None:
    """A hang (model.is_hang: the one rule, the watcher's too) in red; a verdict that is no hang
    (a straggler, a slow collective, ranks unseen or alone) in the milder colour; none: neither."""
    if diagnosis is None:
        return None
    return HANG if is_hang(diagnosis.kind) else MILD


class DiagnosisPanel(VerticalScroll):
    DEFAULT_CSS = """
    DiagnosisPanel { height: auto; max-height: 12; border: round $success; padding: 0 1; }
    DiagnosisPanel.-hang { border: round $error; }
    DiagnosisPanel.-mild { border: round $warning; }
    DiagnosisPanel > Static { width: 1fr; }
    """

    _shown: Text | None = None

    def compose(self):
        yield Static(id="diagnosis-text")

    def show(self, snapshot: Snapshot) -> None:
        diagnosis = snapshot.diagnosis
        painted = colour(diagnosis)
        self.set_class(painted == HANG, HANG)
        self.set_class(painted == MILD, MILD)
        if diagnosis:
            named = ",".join(str(r) for r in diagnosis.named)
            look = (f"look at rank{'s' if len(diagnosis.culprits) > 1 else ''} {named}" if diagnosis.culprits else
                    f"one of ranks {named}" if named else "")
            parts = (diagnosis.kind.upper(), fmt.since_text(diagnosis, snapshot.time), look)
            self.border_title = " · ".join(p for p in parts if p)
        else:
            self.border_title = waiting_title(snapshot)
        text = render_diagnosis(snapshot)
        if text != self._shown:          # an update lays the screen out again: only on change
            self._shown = text
            self.query_one("#diagnosis-text", Static).update(text)


def waiting_title(snapshot: Snapshot) -> str:
    """No verdict: "no hang" only while no rank has stopped making progress; else what the rank
    table shows already (rank 3 idle 10s), until the watcher's threshold decides."""
    stopped = [r for r in snapshot.ranks if fmt.stalled(r)]
    if not stopped:
        return "no hang"
    longest = max(r.idle_for for r in stopped)
    return (f"no verdict yet · {who([r.key for r in stopped])} without progress for {fmt.duration(longest)} "
            f"(a verdict at {snapshot.threshold:g}s)")


SHOWN_GUILTY = 3      # more guilty ranks than this are listed by number only


def render_diagnosis(snapshot: Snapshot) -> Text:
    """Most important first, since an 80x24 terminal shows the first few lines: what happened,
    whom to look at, what may make the picture wrong (a lost node, no ptrace), then why."""
    text = Text()
    diagnosis = snapshot.diagnosis
    if diagnosis:
        # The verdict alone: what preflight said of its nodes comes after the causes (on an 80x24
        # screen the sentence would push them off), in lines of its own.
        text.append(shown(summary(replace(diagnosis, notes=()))) + "\n", "bold")
        where = {r.key: r for r in snapshot.ranks}
        named = list(diagnosis.named)
        for rank in named[:SHOWN_GUILTY]:
            view = shown_data(where.get(rank))
            place = f" on {view.node} at {view.frame or '?'} ({view.function or '?'})" if view else ""
            text.append(f"{'!' if diagnosis.culprits else '?'} {label(rank)}{place}\n", "bold red")
        rest = named[SHOWN_GUILTY:]
        if rest:
            text.append(f"! and {len(rest)} more: {who(rest)}\n", "bold red")
    else:
        states = Counter(shown(r.state) for r in snapshot.ranks)
        text.append(", ".join(f"{n} {state}" for state, n in states.most_common()) or "no ranks found yet")
        text.append("\n")
    for message in snapshot.messages:
        text.append("note: ", "bold yellow")
        text.append(shown(message) + "\n")
    if diagnosis:
        for i, cause in enumerate(diagnosis.causes):
            text.append("likely: " if i == 0 else "    or: ", "bold")
            text.append(shown(cause_line(cause)) + "\n")
    for note in diagnosis.notes if diagnosis else ():
        text.append("preflight said: ", "bold yellow")
        text.append(shown(note_line(note)) + "\n")
    for path in snapshot.incidents:
        text.append("bundle: ", "bold")
        text.append(shown(path) + "\n")
    for seen in diagnosis.evidence if diagnosis else ():
        text.append("seen: ", "dim")
        text.append(shown(evidence_line(seen)) + "\n")
    text.rstrip()
    return text
