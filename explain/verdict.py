"""The root of what the inputs show, as one hangwatch verdict (model.Diagnosis) with the lines it
rests on. A run that ddp-preflight --launch ran left its verdict in result.json: that verdict is
the answer, decided live by hangwatch from more than the files hold (each rank's exit on one
clock, its own record, the kernel's word on who closed first); the files add their lines. Any
other run is decided here: first what a failure's own words name (words.py: a launcher's, then a
rank's, then the rank the others' collectives say is behind), then how the ranks ended, by the
one rule of who failed first (ended.py: hangwatch/exits.py's judge). The victims are evidence
under it, never the root. Pure: over what logs.py and records.py gathered."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hangwatch import causes
from hangwatch.model import Basis, Diagnosis, Evidence, Reason
from rules.fix import Fix

from . import inputs
from .ended import judged
from .evidence import evidence
from .gather import gather
from .root import quotes
from .seen import Gathered, Quote
from .words import named_by_words


@dataclass(frozen=True)
class Explanation:
    """What `explain` says: the verdict (None: no failure found), the fix to paste, the lines the
    verdict rests on, and what was read."""
    diagnosis: Diagnosis | None
    fix: Fix | None = None
    quotes: tuple[Quote, ...] = ()
    read: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    saved: bool = False              # the verdict is the one a launch saved in its result.json

    def to_json(self) -> dict:
        return {"ok": self.diagnosis is None, "diagnosis": self.diagnosis.to_json() if self.diagnosis else None,
                "fix": self.fix.text() if self.fix else None, "saved": self.saved,
                "quotes": [{"path": q.path, "line": q.line, "text": q.text} for q in self.quotes],
                "read": list(self.read), "skipped": list(self.skipped)}


def explain(paths: list[str]) -> Explanation:
    """Read every input (inputs.InputError when a path cannot be read at all) and name the root."""
    return decide(gather(inputs.find(paths)))


def decide(g: Gathered) -> Explanation:
    read, skipped = tuple(g.read), tuple(g.skipped)
    if g.saved is not None:
        return _as_saved(g)
    if g.finished:
        return Explanation(None, read=read, skipped=skipped)      # the launch's word: every rank exited 0
    root = named_by_words(g) or judged(g)
    if root is None:
        return Explanation(None, read=read, skipped=skipped)
    found = evidence(g, root)
    basis = (Basis.SEQUENCE if root.reason is Reason.BEHIND and any(e.seq is not None for e in found) else
             Basis.WORDS if root.named_by_words else Basis.EVIDENCE)
    d = Diagnosis(kind=root.kind, culprits=tuple(root.culprits), candidates=tuple(root.candidates), reason=root.reason,
                  certainty=root.certainty, evidence=tuple(found), causes=causes.of(root.reason, root.fix),
                  nodes=tuple(root.nodes), store=root.store, unknown_why=root.unknown_why, world=g.world, basis=basis)
    return Explanation(d, root.fix, tuple(root.quotes), read, skipped)


def _as_saved(g: Gathered) -> Explanation:
    """The verdict a launch saved, as it was decided; what the files add: the lines its named ranks'
    ends rest on, and each rank's line where the saved evidence has none."""
    d = g.saved
    assert d is not None
    by = {r.key: r for r in g.ranks}
    named = [by[k] for k in d.named if k in by]
    lines = quotes(named) + [q for r in named if not r.quotes for q in r.exit_quotes[:1]]
    lines += [g.result] if g.result is not None else []
    d = replace(d, evidence=tuple(_with_line(e, by) for e in d.evidence))
    return Explanation(d, None, tuple(lines), tuple(g.read), tuple(g.skipped), saved=True)


def _with_line(e: Evidence, by: dict) -> Evidence:
    seen = by.get(e.key)
    if e.quote is not None or seen is None:
        return e
    lines = seen.quotes or seen.exit_quotes or seen.watchdog_quotes
    return replace(e, quote=str(lines[0])) if lines else e

