"""The root of what the inputs show, as one hangwatch verdict (model.Diagnosis) with the lines it
rests on. A run that ddp-preflight --launch ran left its verdict in result.json: that verdict is
the answer, decided live by hangwatch from more than the files hold (each rank's exit on one
clock, its own record, the kernel's word on who closed first); the files add their lines. Any
other run goes to the one judge the live watcher and a launch's summary use: what the failures'
own words name (hangwatch/named.py, through words.py, which adds what only files hold: the OOM
killer's and NCCL's watchdog lines, the rank the others' collectives say is behind), then how the
ranks ended, by the one rule of who failed first (ended.py: hangwatch/exits.py's judge). The
victims are evidence under it, never the root. Pure: over what logs.py and records.py gathered."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ddp_preflight.hangwatch import causes
from ddp_preflight.hangwatch.model import Basis, Certainty, Diagnosis, Evidence, Reason
from ddp_preflight.rules.failures import BY_ID, Cause, FailureKind, Sure
from ddp_preflight.rules.fix import Fix, change

from . import inputs
from .boundaries import split_runs
from .ended import judged
from .evidence import evidence
from .finding import Finding, find
from .fits import fitted
from .gather import gather
from .root import Root, quotes
from .runs import separate
from .seen import Gathered, Quote
from .watchdog_root import from_watchdog
from .words import named_by_words

LONGEST_TIMEOUT_FIX_MS = 30 * 60 * 1000      # hangwatch/causes.py's TIMED_OUT fix: timeout=timedelta(minutes=30)


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
    finding: Finding | None = None   # what the catalogued messages say failed (finding.py)
    runs: tuple[Explanation, ...] = ()   # inputs of separate runs (runs.py): each explained alone
    stopped: str | None = None       # a watched launch ddp-preflight stopped with no hang named: why it stopped

    @property
    def ok(self) -> bool:
        """No failure found: no verdict, and no catalogued failure in any log (of any run)."""
        return self.diagnosis is None and self.finding is None and all(r.ok for r in self.runs)

    def to_json(self) -> dict:
        return {"ok": self.ok, "diagnosis": self.diagnosis.to_json() if self.diagnosis else None,
                "finding": self.finding.to_json() if self.finding else None,
                "runs": [r.to_json() for r in self.runs],
                "fix": self.fix.text() if self.fix else None, "saved": self.saved, "stopped": self.stopped,
                "quotes": [{"path": q.path, "line": q.line, "text": q.text} for q in self.quotes],
                "read": list(self.read), "skipped": list(self.skipped)}


def explain(paths: list[str]) -> Explanation:
    """Read every input (inputs.InputError when a path cannot be read at all) and name the root;
    inputs of separate runs (runs.py) are explained each alone."""
    found = inputs.find(paths)
    gathered = gather(found)
    runs = separate(paths, found, gathered.messages)
    if len(runs) == 1:
        pasted = split_runs(found)        # one pasted file that holds several runs (boundaries.py)
        if pasted is None:
            return fitted(decide(gathered), gathered.messages.shown)
        return Explanation(None, read=tuple(gathered.read), skipped=tuple(gathered.skipped),
                           runs=tuple(fitted(decide(g), g.messages.shown) for g in pasted))
    return Explanation(None, read=tuple(gathered.read), skipped=tuple(gathered.skipped),
                       runs=tuple(fitted(decide(g), g.messages.shown) for g in (gather(run) for run in runs)))


def decide(g: Gathered) -> Explanation:
    read, skipped = tuple(g.read), tuple(g.skipped)
    if g.saved is not None:
        return _as_saved(g)
    if g.finished:
        return Explanation(None, read=read, skipped=skipped)      # the launch's word: every rank exited 0
    finding = _node_not_started(g) or find(g.messages)
    if finding is not None and finding.kind is FailureKind.NODE_NOT_STARTED:
        return Explanation(None, finding.fix, finding.quotes, read, skipped, finding=finding)
    root = from_watchdog(g, finding) or named_by_words(g) or judged(g)
    if root is not None and finding is not None and _writers_only(root) and not _agrees(g, root, finding):
        # a writer nothing numbers, whose words are not what the messages show: a candidate at most
        root.candidates, root.culprits, root.certainty = [*root.culprits, *root.candidates], [], Certainty.UNSURE
    if root is None:
        return Explanation(None, finding.fix if finding else None, finding.quotes if finding else (), read, skipped,
                           finding=finding, stopped=g.stop_reason if g.watched_no_hang else None)
    found = evidence(g, root)
    basis = (Basis.SEQUENCE if root.reason is Reason.BEHIND and any(e.seq is not None for e in found) else
             Basis.WORDS if root.named_by_words else Basis.EVIDENCE)
    d = Diagnosis(kind=root.kind, culprits=tuple(root.culprits), candidates=tuple(root.candidates), reason=root.reason,
                  certainty=root.certainty, evidence=tuple(found), causes=_causes(root, finding),
                  nodes=tuple(root.nodes), store=root.store, unknown_why=root.unknown_why, world=g.world, basis=basis)
    if finding is not None and d.culprits:
        # One culprit list: the verdict's. What the messages' own reading names (a launcher's table
        # in file-read order, a local rank taken for a global one) never adds other ranks beside it.
        finding = replace(finding, culprits=tuple(k for k in finding.culprits if k in d.culprits))
    return Explanation(d, root.fix or (finding.fix if finding else None), tuple(root.quotes), read, skipped,
                       finding=finding)


def _node_not_started(g: Gathered) -> Finding | None:
    """A launch whose training never ran on a node (result.json: the node's own error, and no rank
    of it ever ended): that is the run's failure, whatever its other nodes' ranks did when the
    launch stopped them. No rank is named: none ran there."""
    ran = {r.node for r in g.ranks if r.exit is not None}
    failed = [n for n in g.node_errors if n.node not in ran]
    if not failed:
        return None
    first = failed[0]
    return Finding(FailureKind.NODE_NOT_STARTED, Cause.NODE_ERROR, (), Sure.CERTAIN,
                   change(first.fix, first.node) if first.fix else None, None, tuple(n.quote for n in failed),
                   {"nodes": {n.node: n.error for n in failed}})


def _writers_only(root: Root) -> bool:
    """The root names only writers whose rank no line says (never a culprit the finding could be wrong beside)."""
    named = [*root.culprits, *root.candidates]
    return bool(named) and not any(isinstance(k, int) for k in named)


def _agrees(g: Gathered, root: Root, finding: Finding) -> bool:
    """The writers it names raised the very failure the messages show (the catalogue's kind of it)."""
    named = {*root.culprits, *root.candidates}
    kinds = {BY_ID[r.exception.failure].kind for r in g.ranks
             if r.key in named and r.exception is not None and r.exception.failure in BY_ID}
    return finding.kind in kinds


def _causes(root: Root, finding: Finding | None) -> tuple:
    """hangwatch's causes of the root's reason, less one whose fix the log shows was already so: a
    run whose watchdog said Timeout(ms)=1800000 is not fixed by timeout=30 minutes."""
    found = causes.of(root.reason, root.fix)
    had = finding.detail.get("timeout_ms") if finding is not None else None
    if root.reason is Reason.TIMED_OUT and isinstance(had, int) and had >= LONGEST_TIMEOUT_FIX_MS:
        return ()
    return found


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

