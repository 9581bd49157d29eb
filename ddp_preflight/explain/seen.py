"""What the inputs said, rank by rank, before any verdict: plain data, each fact with the lines it
rests on (file:line)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ddp_preflight.hangwatch.exits import StoppedBy
from ddp_preflight.hangwatch.failures import Said, WatchdogLine
from ddp_preflight.hangwatch.model import Diagnosis
from ddp_preflight.hangwatch.torchrun_table import FirstObservedFailure
from ddp_preflight.hangwatch.tracebacks import ExceptionInfo
from ddp_preflight.hangwatch.who import Unnumbered, Who
from ddp_preflight.node.protocol import ExitStatus

from .messages import Messages
from .quote import Quote


@dataclass
class RankSeen:
    """One rank (or one writer whose rank is not known yet) as the inputs showed it."""
    node: str | None
    rank: int | None
    local_rank: int | None = None
    exception: ExceptionInfo | None = None
    source: str = "output"                  # where its exception was read: "output" | "record" (an error file)
    said: Said | None = None                # what its exception's words name (failures.py)
    quotes: list[Quote] = field(default_factory=list)     # the lines its exception rests on
    exit: ExitStatus | None = None          # its exit code or signal (torchrun's table, a launch's result.json)
    exit_quotes: list[Quote] = field(default_factory=list)
    stopped_by: StoppedBy | None = None     # the launcher that began stopping it before it ended (result.json)
    pid: int | None = None                  # its process (torchrun's table, a launch's result.json)
    writer: str | None = None               # where it was read, when its rank is not known
    watchdog: WatchdogLine | None = None    # NCCL's watchdog on it: the collective that timed out
    enqueued: int | None = None             # ... and where its group was
    completed: int | None = None
    watchdog_quotes: list[Quote] = field(default_factory=list)
    flight: dict | None = None              # its Flight Recorder: {"entries": [...], "path": str}
    frame: str | None = None                # where a live watcher saw it ("train.py:88": an incident bundle)

    @property
    def key(self) -> Who:
        """How the verdict names it: its rank, or what is known of it (never a made-up number)."""
        if self.rank is not None:
            return self.rank
        where = self.writer or (f"local rank {self.local_rank}" if self.local_rank is not None else "a rank") + \
            (f" on {self.node}" if self.node else "")
        return Unnumbered(self.node, self.pid, where)


@dataclass
class NodeSaid:
    """A line or exception of a launcher (torchrun, ddp-preflight) or of the machine, not a rank's."""
    node: str | None
    said: Said
    text: str
    quotes: list[Quote] = field(default_factory=list)


@dataclass(frozen=True)
class NodeError:
    """A node of a launch that failed as a node (result.json's nodes[].error): the launch could not
    start its training there, or lost it; not a rank's failure."""
    node: str
    error: str
    fix: str | None
    quote: Quote


@dataclass
class Gathered:
    """Everything read, from every input."""
    ranks: list[RankSeen] = field(default_factory=list)
    nodes: list[NodeSaid] = field(default_factory=list)
    tables: list[tuple[str | None, FirstObservedFailure, Quote]] = field(default_factory=list)
    world: int | None = None
    nproc_per_node: int | None = None
    node_order: list[str] = field(default_factory=list)      # nodes by node rank (a launch's plan)
    node_ranks: dict[str, list[int]] = field(default_factory=dict)   # ... each node's global ranks (its plan)

    def node_of(self, rank: int) -> str | None:
        """The node a launch's plan put a global rank on: its own list, each node's count may
        differ (a hostfile's slots); else node rank x ranks per node; None when no plan says."""
        for node, ranks in self.node_ranks.items():
            if rank in ranks:
                return node
        if self.node_ranks or not self.nproc_per_node or rank // self.nproc_per_node >= len(self.node_order):
            return None
        return self.node_order[rank // self.nproc_per_node]

    def first_ranks(self) -> dict[str, int]:
        """Each planned node's first global rank (its local rank 0's)."""
        if self.node_ranks:
            return {node: min(ranks) for node, ranks in self.node_ranks.items() if ranks}
        return {node: i * self.nproc_per_node for i, node in enumerate(self.node_order)} if self.nproc_per_node else {}
    stop_reason: str | None = None                           # a launch's: why it was stopped
    launched: bool = False                                   # a ddp-preflight --launch run (its plan.json was read)
    result: Quote | None = None                              # a launch's result.json with a verdict, when read
    finished: bool = False                                   # ... a result.json that says every rank exited 0
    saved: Diagnosis | None = None                           # ... and the verdict it saved (hangwatch's, live)
    node_errors: list[NodeError] = field(default_factory=list)   # ... the nodes it could not start or lost
    watched: bool = False                                    # ... hangwatch watched its nodes (result.json)
    hang_bundled: bool = False                               # an incident bundle of a hang hangwatch named was read
    messages: Messages = field(default_factory=Messages)     # the catalogued messages of every log, in order
    twice: set[int] = field(default_factory=set)             # ranks whose end is said twice, differently (two
                                                             # tables: another pid, code or node): two runs' ends
    read: list[str] = field(default_factory=list)            # inputs read
    skipped: list[str] = field(default_factory=list)         # inputs not read, with why

    @property
    def watched_no_hang(self) -> bool:
        """ddp-preflight stopped a launch that hangwatch watched to the end and named no hang in
        (result.json saved none, no incident bundle of one): its Flight Recorders were kept while
        the ranks ran, and ranks one collective apart in them are a run in flight, not a hang. The
        live judge saw their progress; the files cannot."""
        return self.watched and self.stop_reason is not None and self.saved is None and not self.hang_bundled

    def rank(self, node: str | None, rank: int | None, local_rank: int | None = None) -> RankSeen:
        """The record of this rank, made on first sight; a writer known only by its local rank
        joins the rank of that node once its global rank is known."""
        for seen in self.ranks:
            if rank is not None and seen.rank == rank:
                if seen.node is None:
                    seen.node = node
                return seen
            if (rank is None or seen.rank is None) and seen.node == node and local_rank is not None \
                    and seen.local_rank == local_rank:
                if seen.rank is None:
                    seen.rank = rank
                return seen
        seen = RankSeen(node, rank, local_rank)
        self.ranks.append(seen)
        return seen
