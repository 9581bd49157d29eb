"""The one pipeline that decides what a run's ranks together say once its progress has stopped.

RULES are ordered; each is a pure function of the run's evidence (stalled.Stall: every rank's
Evidence, how its ended ranks ended, what its store said, how long it has waited) that either
decides (a verdict, or a Hold: nothing to say now) or passes (None). The first decision wins and
nothing after it changes it: `decide()` only adds what preflight said of the named ranks' nodes.
The watcher (verdicts.py) gathers the evidence and says the verdict; tests and replays call
`decide()` (or `diagnose()`) on evidence of their own. Two other questions have a rule of their
own, beside the pipeline, because other evidence answers them: torchruns that wait before any
rank starts (rendezvous.torchruns_waiting) and ranks that never connect (trains_alone). How each
rank ended is exits.judge's, which the pipeline reads as evidence.

No words here: a verdict is data (model.Diagnosis), rendered at the edge (text.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from . import notes
from .causes import TRAINS_ALONE
from .model import Certainty, Diagnosis, Evidence, Kind, Reason, Word
from .model import RankStatus as S
from .rendezvous import never_checked_in
from .stalled import Stall
from .waiting import all_waiting, deadlock, ended_first, skipped_in_group, straggler, unseen, unseen_while_waiting
from .who import Who


class Hold(Word):
    """A decision to say nothing now."""
    STOPPING = "stopping"            # someone is stopping the run (Ctrl-C, a scheduler, a launcher): no hang
    STORE_COMING = "store-coming"    # its store's answer is on its way (read under a short deadline): judged with it
    BEING_READ = "being-read"        # our py-spy holds a rank it reads: its CPU and place are told once it lets go
    PLACING = "placing"              # a rank seen in init_process_group used CPU since: its stack is read again first
    ENDS_COMING = "ends-coming"      # a rank seen gone: its agent's exit message (its code, its record) is on its way
    NOTHING = "nothing"              # nothing is stuck


Rule = Callable[[Stall], "Diagnosis | Hold | None"]


def being_stopped(s: Stall) -> Hold | None:
    """A rank of the run ended by a stopping signal (SIGTERM, SIGINT, SIGHUP) and no end of it
    failed: the run is being stopped, not hung."""
    stopped = any(e.state is S.EXITED and e.exit is not None and e.exit.stopped for e in s.ranks.values())
    return Hold.STOPPING if stopped and s.ended is None else None


def store_coming(s: Stall) -> Hold | None:
    return Hold.STORE_COMING if s.store_coming else None


def ends_coming(s: Stall) -> Hold | None:
    return Hold.ENDS_COMING if s.ends_coming else None


def being_read(s: Stall) -> Hold | None:
    return Hold.BEING_READ if s.being_read else None


def placing(s: Stall) -> Hold | None:
    return Hold.PLACING if s.placing else None


def nothing(s: Stall) -> Hold:
    return Hold.NOTHING


RULES: tuple[Rule, ...] = (
    being_stopped,           # a stop, not a hang
    store_coming,            # wait for the store's answer
    being_read,              # wait for the ranks our py-spy holds (within its bound, and a sample of their own)
    ends_coming,             # wait for how a rank seen gone ended (its agent's exit message, within a bound)
    placing,                 # read again a rank that used CPU since its stack showed it in init_process_group
    never_checked_in,        # ranks in init_process_group, none in a collective: who never checked in
    straggler,               # ranks wait while another works: a straggler, or one that never arrives (endless)
    ended_first,             # ranks wait while others ended: the ends no other explains
    deadlock,                # ranks wait while others are stuck outside the collective
    unseen_while_waiting,    # ranks wait and only unseen ranks could be to blame (or stacks are unavailable)
    skipped_in_group,        # every rank waits, in different groups' collectives: who skipped a subgroup's
    all_waiting,             # every rank waits: a mismatch, a rank behind, a GPU, a cycle, a slow or lost link
    unseen,                  # nobody waits and some ranks are unseen
    nothing,
)


def decide(s: Stall, rules: Sequence[Rule] = RULES) -> Diagnosis | Hold:
    """The first rule's decision; a verdict with what preflight said of its named ranks' nodes."""
    for rule in rules:
        found = rule(s)
        if found is None:
            continue
        if isinstance(found, Hold):
            return found
        return replace(found, notes=notes.of_verdict(s.notes, found, {k: e.node for k, e in s.ranks.items()}))
    return Hold.NOTHING


def diagnose(ranks: Mapping[Who, Evidence], ended: Diagnosis | None = None) -> Diagnosis:
    """The pipeline over these ranks alone (no store read, no time waited): a verdict, or kind
    `none` when it holds."""
    found = decide(Stall(ranks, ended=ended))
    return found if isinstance(found, Diagnosis) else Diagnosis(kind=Kind.NONE, evidence=Stall(ranks).evidence)


def trains_alone(ranks: Sequence[Evidence], world: int, seconds: float, reason: Reason | None = None) -> Diagnosis:
    """Every rank of a world of more than one has worked for `seconds` without a connection, each
    in a training step of its own where `reason` is TRAINING."""
    return Diagnosis(kind=Kind.ALONE, evidence=tuple(ranks), world=world, waited=seconds, causes=TRAINS_ALONE,
                     certainty=Certainty.CERTAIN, reason=reason)
