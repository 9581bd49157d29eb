"""What the watch says, one event at a time: `hangwatch attach` prints them (--json as objects),
the launcher relays them. An event that says a verdict carries it as data (`verdict`); its line is
rendered from it at the edge (render.event_text, by the watcher's shell), never by the decisions."""

from __future__ import annotations

from dataclasses import dataclass, field

from .model import Diagnosis, Snapshot, Word
from .who import Who


class EventKind(Word):
    """What an event is about (the --json stream's "event")."""
    RANK_FOUND = "rank-found"
    RANK_GONE = "rank-gone"
    NODE = "node"                 # a node's agent: watching, lost, watched again, failed
    DIAGNOSIS = "diagnosis"       # a hang named (a bundle follows)
    STRAGGLER = "straggler"       # a rank others wait for: not a hang
    RESUMED = "resumed"           # every rank makes progress again
    INCIDENT = "incident"         # a bundle written
    NOTICE = "notice"             # anything else worth a line: a verdict that is no hang, a refusal, a fix
    FINISHED = "finished"         # attach: the run it followed is over (every rank ended, its torchruns leaving)


@dataclass
class Event:
    kind: EventKind
    text: str = ""                    # the line; for a verdict, rendered from `verdict` at the edge
    snapshot: Snapshot | None = None
    data: dict = field(default_factory=dict)
    verdict: Diagnosis | None = None  # the verdict it says (a hang, a straggler, ranks unseen or alone)
    connected: tuple[Who, ...] = ()   # ranks said to train alone that connected after all: that verdict taken back

    @property
    def hang(self) -> bool:
        """It names a hang: --exit-on-hang stops, hangwatch exits 1."""
        return self.kind is EventKind.DIAGNOSIS and self.verdict is not None and self.verdict.kind.is_hang
