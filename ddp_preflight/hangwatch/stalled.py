"""What one run shows once its progress has stopped (`Stall`): every rank's evidence and the few
facts about the run the verdict rules read (diagnose.py's pipeline). Plain data, gathered from
the watcher's state by verdicts.py (or built by a test, or by a replay of recorded evidence),
and the small questions every rule asks of it: who works, who waits, who is stuck, who is
unseen. Pure."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from ddp_preflight.node.protocol import StoreAnswer

from .causes import CAUSES
from .model import Certainty, Diagnosis, Evidence, Kind, NodeNote, Reason
from .model import RankStatus as S
from .who import Who

# "running": it has used CPU since its stack was taken. Whatever it does, it is not stuck.
WORKING = (S.COMPUTING, S.COMPILING, S.IMPORTING, S.LOADING_DATA, S.SAVING, S.RUNNING)
WAITING = (S.COLLECTIVE, S.GPU_WAIT)


@dataclass(frozen=True)
class Stall:
    """One run at the moment its progress is judged (immutable: what the rules ask of it is
    computed once)."""
    ranks: Mapping[Who, Evidence]             # every rank of the run, by key (its number, or what is known of it)
    waited: float | None = None               # seconds since its progress stopped (None: not timed)
    ended: Diagnosis | None = None            # exits.judge's verdict on its ranks that ended, when some did
    store: StoreAnswer | None = None          # what its store said since its ranks began to wait in init_process_group
    store_coming: bool = False                # an agent is reading that store now: its answer is on its way
    ends_coming: bool = False                 # a rank of it seen gone: its agent's exit message is on its way
    being_read: bool = False                  # a rank that worked at its last sample of its own is held by our
                                              # py-spy since (reading its stack): neither its CPU nor its place known
    placing: bool = False                     # a rank its stack showed in init_process_group has used CPU since:
                                              # its stack is read again before a verdict leaves it out
    planned: Mapping[int, str] = field(default_factory=dict)   # rank -> node, from a launch plan
    endless: float = math.inf                 # seconds a rank may compute while the others wait (--endless-after)
    held_after: float = math.inf              # seconds a rank may sit in its own code (asleep, reading) while the
                                              # others wait, before that wait is taken as never ending
    quiet: float | None = None                # every live rank watched and quiet: for how long (None: not so)
    idle_share: float | None = None           # the share of the last `idle_span` s the waiting ranks spent idle
    idle_span: int | None = None
    notes: Mapping[str, tuple[NodeNote, ...]] = field(default_factory=dict)   # node -> what preflight said of it
    find_groups: Callable[[], tuple[frozenset[Who], ...]] = tuple   # the groups below, found when asked

    @cached_property
    def evidence(self) -> tuple[Evidence, ...]:
        """Every rank's evidence, by key: the verdict's `evidence`."""
        return tuple(e for _, e in sorted(self.ranks.items()))

    @cached_property
    def groups(self) -> tuple[frozenset[Who], ...]:
        """Ranks that share a process group of their own, as their connections show
        (meshes.shared_groups): read only by the rule that needs it."""
        return self.find_groups()

    def where(self, *states: S) -> dict[Who, Evidence]:
        return {k: e for k, e in self.ranks.items() if e.state in states}

    @cached_property
    def waiting(self) -> dict[Who, Evidence]:
        """Ranks that wait in a collective or on their GPU."""
        return self.where(*WAITING)

    @cached_property
    def busy(self) -> dict[Who, Evidence]:
        return {k: e for k, e in self.ranks.items() if working(e)}

    @cached_property
    def halted(self) -> dict[Who, Evidence]:
        return {k: e for k, e in self.ranks.items() if stuck(e)}

    @cached_property
    def unknown(self) -> dict[Who, Evidence]:
        return self.where(S.UNKNOWN)


def working(e: Evidence) -> bool:
    """It does something that may arrive: it computes, compiles, saves or loads with CPU (its own
    or its workers'). A loader whose workers do nothing is stuck (its reason says so)."""
    return e.state in WORKING and e.reason is None


def stuck(e: Evidence) -> bool:
    """Neither working, nor waiting in a collective, nor gone, nor unseen: where it is, its reason
    says (left the loop, a lock, its data, I/O, stopped)."""
    return e.state not in WAITING and e.state not in (S.EXITED, S.UNKNOWN, S.RENDEZVOUS) and not working(e)


def held_up_by(s: Stall, busy: Mapping[Who, Evidence], evidence: tuple[Evidence, ...]) -> Diagnosis:
    """Ranks work while the others wait for them: a straggler (not a hang), with what it costs the
    others; or, once the others have waited past `s.endless` while it computes (compiling, saving
    and loading data may take that long and arrive: only computing counts), one that never arrives."""
    culprits = tuple(sorted(busy))
    # Only a rank its stack shows computing at a line of its own: one busy at no known line (its stack
    # unread or withheld since it used CPU) may be anything that arrives (issue 35's soak: "rank 3 has
    # computed for 61 s at an unknown line" while it waited with the others for a checkpoint).
    computing = bool(busy) and all(e.state in (S.COMPUTING, S.RUNNING) and e.frame is not None
                                   for e in busy.values())
    if s.waited is not None and s.waited >= s.endless and computing:
        return Diagnosis(kind=Kind.ENDLESS, culprits=culprits, reason=Reason.COMPUTES_FOREVER,
                         certainty=Certainty.LIKELY, evidence=evidence, waited=round(s.waited, 1), bound=s.endless,
                         causes=CAUSES[Reason.COMPUTES_FOREVER])
    return Diagnosis(kind=Kind.STRAGGLER, culprits=culprits, reason=Reason.STRAGGLING, evidence=evidence,
                     idle_share=s.idle_share, idle_span=s.idle_span if s.idle_share is not None else None)
