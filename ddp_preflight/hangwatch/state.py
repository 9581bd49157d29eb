"""What the watcher holds between inputs: each node, each rank it follows (a Track), what it has
said. Updated in place by the reducer's parts, and only by them; snapshot() copies it out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ddp_preflight.node import protocol
from ddp_preflight.node.protocol import ExitStatus

from . import stall
from .classify import Frame, frames_of
from .events import Event, EventKind
from .inputs import Effect, Say
from .model import Diagnosis, Kind, NodeNote, NodeView, RankStatus, RankView, Seen, Snapshot, Unnumbered, Who, Word

ENDLESS_TIMES = 5         # a straggler that keeps the others waiting this many thresholds is a hang
SILENT_SAMPLES = 5        # an agent reports every sample interval: this many missed, its node is lost
SILENT_FLOOR = 2.0        # seconds: never less, however short the interval
GONE, SILENT = "is gone", "went silent"      # how a node's agent was lost (State.lost)
MESSAGES = 200            # notices kept (the snapshot shows the last 20)


@dataclass(frozen=True)
class Withheld:
    """A rank's Python frames held back for their native ones."""
    taken: float                      # when they were taken (their ask's time)
    dump: list
    seen: float                       # when they came


@dataclass
class Track:
    """One rank as the watcher follows it: its view, and the evidence the verdicts read."""
    view: RankView
    start: int = 0
    info: protocol.RankFound | None = None
    run: int = 0                      # the run (world) it belongs to: ranks alive together with one store
    duplicate: bool = False           # another live process claims its rank number (it is named by pid)
    # progress
    idle_since: float | None = None   # since when it has made no progress (no CPU of its own or its
                                      # helpers', or a wait its stacks show unchanged while it spins)
    busy_at: float | None = None      # the last sample that used CPU
    quiet_at: float | None = None     # the last sample in which it used none (its own and its helpers')
    free_at: float | None = None      # the last sample our own py-spy did not hold it in (its CPU its own)
    read_at: float | None = None      # when an agent's stacks of it last came (either part of an answer)
    moved: int = 0                    # bytes it read or wrote since idle_since
    wire: int | None = None           # bytes its TCP connections had carried at the last sample (node/wire.py)
    wire_at: float | None = None      # the last sample at which they had carried more (or others): progress
    progress_at: float | None = None  # its last progress no sample shows: a new step line the launcher read,
                                      # Flight Recorder numbers that moved between two reads
    flight_at: float | None = None    # when its Flight Recorder in hand (view.flight) was read
    io_known: bool = False            # its I/O counters are readable
    proc_state: str | None = None     # /proc's state letter at the last sample (R, S, D, T, t, Z)
    children_cpu: float | None = None
    spinning: bool = False            # idle though busy: its stack shows one wait, unchanged, with no progress
    # stacks
    dump: list | None = None
    dump_error: str | None = None
    stack_at: float | None = None     # when the stack in hand was taken (no earlier than this)
    withheld: Withheld | None = None  # Python frames newer than the stack in hand, held back: their native
                                      # frames follow (the stack in hand is older)
    last_wait: tuple | None = None    # (where it waited, when first seen there) from its stacks, while it spins
    sockets: protocol.SocketQueues | None = None
    # its end
    gone_at: float | None = None      # when the watcher learned it was gone (monotonic)
    exit_t: float | None = None       # when it ended, on the master's clock (epoch s): its record's time or its exit's
    exit_status: ExitStatus | None = None
    exit_heard: bool = False          # its agent's exit message came (its code, its own record of its end)
    ending: dict | None = None        # its own record of how its script ended (PID.end)
    exception: Seen | None = None     # an exception it printed (its output) or recorded
    quote: str | None = None          # the output line the exception rests on
    logged: bool = False              # that exception was only logged (NCCL's watchdog), not raised: a later
                                      # step of the rank withdraws it (ended.went_on)
    oom: bool | None = None
    stopped_by: str | None = None     # the launcher that began stopping its node before it ended
    endpoints: frozenset[str] = frozenset()   # every local "ip:port" its TCP sockets had (kept after it ended)
    links: frozenset[tuple[str, str]] = frozenset()   # its established connections (local, remote) when
                                                      # last counted: the meshes of its process groups
    leaving: bool | None = None       # it had closed connections of its own when a rank of its node first
                                      # ended (None: not known)
    # connections
    alone_since: float | None = None  # since when it has had no TCP connection (None: not counted, or it had one)
    talked: bool = False              # it has had a connection: it joined a process group
    torch: bool = False               # torch's library is mapped in it: it imported torch
    training: str | None = None       # a training step its stacks showed since alone_since ("backward at x.py:9")
    read: tuple[list, list[Frame]] | None = field(default=None, repr=False, compare=False)   # (dump, its frames):
                                      # frames_of read once per stack (frames())

    @property
    def key(self) -> Who:
        """How verdicts name it: its rank, or its process (Unnumbered) when its rank is unknown or
        claimed by another live process too."""
        return self.view.rank if self.view.rank is not None and not self.duplicate else \
            Unnumbered(self.view.node, self.view.pid)

    @property
    def ended(self) -> bool:
        return self.view.state is RankStatus.EXITED

    @property
    def stopped(self) -> bool:
        """The kernel holds it: SIGSTOP (T), or a tracer other than the agent's own py-spy (t: the
        agent reports the state of a rank it is dumping as unknown)."""
        return self.proc_state in ("T", "t")

    @property
    def launcher(self) -> int | None:
        return self.info.ppid if self.info is not None else None

    def frames(self) -> list[Frame]:
        """frames_of(its stack in hand), read once per stack: a stack is replaced, never changed in
        place (agents.py), and reading it builds every frame (most of a stall's judging at 4,096
        ranks). Shared: never to be changed by the caller."""
        if self.dump is None:
            return []
        if self.read is None or self.read[0] is not self.dump:
            self.read = (self.dump, frames_of(self.dump))
        return self.read[1]

    def held_since_read(self) -> bool:
        """Our py-spy read it and it has had no sample of its own since: its CPU is unknown."""
        return self.read_at is not None and (self.free_at is None or self.free_at <= self.read_at)


@dataclass
class Launcher:
    """A torchrun on a node, as the watcher follows it: until it starts its ranks, it waits for the
    other nodes' torchruns (its rendezvous)."""
    node: str
    info: protocol.LauncherFound
    quiet_since: float | None = None   # since when it has used no CPU with no rank started
    ranks: int = 0                     # its ranks alive now
    had_ranks: bool = False            # it has started ranks: past its rendezvous


@dataclass(frozen=True)
class Config:
    threshold: float = stall.DEFAULT_THRESHOLD   # seconds without progress before a hang is named
    interval: float = 1.0                        # the agents' sample interval, seconds
    native: bool = False                         # native frames in every stack
    endless_after: float | None = None           # seconds a rank may compute while the others wait
                                                 # (None: ENDLESS_TIMES x the threshold)
    notes: dict[str, tuple[NodeNote, ...]] = field(default_factory=dict)   # node -> what preflight said of it
    planned: Mapping[int, str] = field(default_factory=dict)   # rank -> node, from a launch plan
    held_after: float = stall.HELD_BOUND         # seconds a rank may sit in its own code while the others wait

    @property
    def silent_after(self) -> float:
        return max(SILENT_SAMPLES * self.interval, SILENT_FLOOR)

    @property
    def endless(self) -> float:
        return self.endless_after if self.endless_after is not None else ENDLESS_TIMES * self.threshold

    @property
    def settle(self) -> float:
        """Seconds after a rank's end before the ends are judged: every agent reports within two
        samples, and a launcher's word on the same end comes over its own link within as long."""
        return 2 * self.interval


class About(Word):
    """What a verdict said once is about."""
    STALL = "stall"              # a run's stall (diagnose.py's pipeline)
    ENDS = "ends"                # a run's ends, judged once they settled (exits.judge)
    TORCHRUNS = "torchruns"      # torchruns that wait for the other nodes' before any rank starts


@dataclass(frozen=True)
class Said:
    """What a verdict is said once for: per run, per kind, per ranks named (an end's: per process,
    since a later run's ranks are other processes; torchruns': per store and missing node ranks)."""
    about: About
    kind: Kind
    named: tuple[Who, ...] = ()
    run: int | None = None
    pids: tuple[int, ...] = ()
    store: str | None = None
    node_ranks: tuple[int, ...] = ()

    @property
    def stands(self) -> bool:
        """Said of what stays true when progress resumes: a rank's end, ranks that train alone,
        torchruns that waited for nodes that never came, a slow rank (a straggler is one while its
        run lasts: said once, not at each of its steps)."""
        return self.kind in (Kind.EXITED, Kind.ALONE, Kind.STRAGGLER) or self.about is About.TORCHRUNS


@dataclass
class State:
    config: Config
    nodes: dict[str, NodeView]
    hello: dict[str, protocol.Hello] = field(default_factory=dict)
    ranks: dict[tuple[str, int], Track] = field(default_factory=dict)
    diagnosis: Diagnosis | None = None
    diagnosis_run: int | None = None          # the run the diagnosis is about (None: every run, or not known)
    wires_at_hang: dict = field(default_factory=dict)   # rank key -> its wire when the hang was said: a
                                              # resume needs its connections to move since (CPU alone may be its end)
    held: dict[int | None, Diagnosis] = field(default_factory=dict)   # run -> a rank held the others up (said
                                              # likely): until progress resumes (verdicts.bound_passed)
    paused: dict = field(default_factory=dict)   # (run, rank key) -> (lines, last start) of its held pauses
                                              # that ended by progress resuming (paused.py: a straggler's evidence)
    incidents: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    asked: dict[str, float] = field(default_factory=dict)    # node -> when stacks were asked, outstanding
    asked_at: float | None = None
    asks: dict[int, float] = field(default_factory=dict)     # the id each ask's answers carry -> when it was asked
    gpu_nodes: set[str] = field(default_factory=set)    # nodes whose agent reads GPUs (NVML): a busy rank
                                                        # there may spin on its GPU in C++
    native_due: set[str] = field(default_factory=set)   # nodes that sent Python frames whose native frames
                                                         # follow (a stall's staged answer)
    bundles_due: list[tuple[float, Diagnosis]] = field(default_factory=list)   # hangs named while native frames
                                            # were due: each bundle waits for them (verdicts.bundle_when_complete)
    reported: set[Said] = field(default_factory=set)         # what was said, so each verdict is said once
    exit_check_at: float | None = None  # judge the ends once they have settled
    heard: dict[str, float] = field(default_factory=dict)    # node -> when its agent last said anything
    lost: dict[str, str] = field(default_factory=dict)       # node -> how its agent was lost
    stopping: bool = False
    stores: dict[str | None, tuple[protocol.StoreAnswer, float]] = field(default_factory=dict)  # master -> said, when
    reading: dict[str | None, float] = field(default_factory=dict)   # master -> when an agent began reading it
    others: bool = False                      # another user's ranks or torchruns are followed (runs.py)
    alone: tuple[tuple[str, int], ...] = ()   # the ranks said to train alone, while that stands
    clock_gap: dict[str, float] = field(default_factory=dict)  # node -> least (master's wall - node's stamp)
    clocks: dict[str, tuple[float, float]] = field(default_factory=dict)   # node -> (round trip, offset): the best
                                                                            # reading of its clock (s)
    clock_asked: dict[str, float] = field(default_factory=dict)  # node -> when its clock was last asked (monotonic)
    runs: int = 0                             # runs seen (Track.run counts from 1)
    launcher_stops: list[tuple[str | None, float, str]] = field(default_factory=list)  # (node, master-clock t, by)
    spin_asked_at: float | None = None        # when stacks were last asked of ranks that use CPU on a GPU
    launchers: dict[tuple[str, int], Launcher] = field(default_factory=dict)   # (node, pid) -> a torchrun
    closures: set[tuple[str, str]] = field(default_factory=set)   # (local, remote) of TIME_WAIT sockets seen:
                                                                   # the local side closed first
    # attach: what the watch has found, and whether the run it followed is over (runs.py)
    formed: set[str | None] = field(default_factory=set)    # stores whose torchruns have started ranks
    samples: dict[str, int] = field(default_factory=dict)   # node -> samples its agent has sent
    found_any: bool = False                   # a rank or a torchrun has been followed
    # Derived values kept until their input changes (kept.py): node -> inputs taken that can change
    # its ranks, the same for every node at once, and what was derived under those counts.
    inputs: dict[str, int] = field(default_factory=dict)
    inputs_all: int = 0
    kept: dict = field(default_factory=dict)
    # Indexes of `ranks`, so that finding a rank costs the same at 16,384 as at 8: kept by found() and
    # made again when `ranks` changed elsewhere (a track added for a rank that ended unseen; every
    # delete calls unindex()). Each key found through them is checked against `ranks`.
    by_rank: dict[tuple[str, int], list[tuple[str, int]]] = field(default_factory=dict)  # (node, rank) -> keys
    per_node: dict[str, int] = field(default_factory=dict)   # node -> its tracks
    by_node: dict[str, dict[tuple, None]] = field(default_factory=dict)  # node -> its tracks' keys, in order
    indexed: int = -1                                         # len(ranks) when indexed
    run_keys: dict[tuple, tuple[str, int]] = field(default_factory=dict)  # (user, store, world) -> a live track's key
    # When the tick judges (reducer._tick, due.py): after an input, or once a bound a verdict reads passed.
    changes: int = 0                          # inputs taken other than ticks
    judged: int | None = None                 # `changes` when the tick last judged (None: never)
    due: float | None = None                  # when it must judge again with no input (None: only at one)
    judgements: int = 0                       # how often it judged (tests, bench/hangwatch_scale.py)
    restated: int | None = None               # the judging that last said a standing verdict again (verdicts._restate)
    counting: tuple[Diagnosis, float] | None = None   # (the standing verdict, when its wait began: epoch s): its
                                              # `waited` as each snapshot shows it, while that one stands

    def index(self) -> None:
        """Index the tracks again, when they changed behind the indexes' back."""
        if self.indexed == len(self.ranks):
            return
        self.by_rank, self.per_node, self.run_keys, self.by_node = {}, {}, {}, {}
        for key, t in self.ranks.items():
            if t.view.rank is not None:
                self.by_rank.setdefault((t.view.node, t.view.rank), []).append(key)
            self.per_node[t.view.node] = self.per_node.get(t.view.node, 0) + 1
            self.by_node.setdefault(t.view.node, {})[key] = None
        self.indexed = len(self.ranks)

    def unindex(self) -> None:
        """Tracks were deleted: index them again when next asked."""
        self.indexed = -1

    def found(self, key: tuple[str, int], track: Track) -> None:
        """A track added (or put in place of one with its key)."""
        self.index()
        if key not in self.ranks:
            self.per_node[key[0]] = self.per_node.get(key[0], 0) + 1
        self.ranks[key] = track
        self.by_node.setdefault(track.view.node, {})[key] = None
        if track.view.rank is not None:
            keys = self.by_rank.setdefault((key[0], track.view.rank), [])
            if key not in keys:
                keys.append(key)
        self.indexed = len(self.ranks)

    def claiming(self, node: str, rank: int) -> list[tuple[str, int]]:
        """The keys of the tracks of `node` that claim `rank`."""
        self.index()
        return [k for k in self.by_rank.get((node, rank), ()) if k in self.ranks and self.ranks[k].view.rank == rank]

    def count(self, node: str) -> int:
        """How many tracks `node` has."""
        self.index()
        return self.per_node.get(node, 0)

    def tracks(self, node: str | None = None) -> list[Track]:
        """Every track, or `node`'s alone (through the index: asking each of 512 nodes cost
        512 x 4,096 looks at 4,096 ranks, a second of a stall's tick)."""
        if node is None:
            return list(self.ranks.values())
        self.index()
        found = (self.ranks.get(k) for k in self.by_node.get(node, ()))
        return [t for t in found if t is not None and t.view.node == node]

    def live(self) -> list[Track]:
        return [t for t in self.ranks.values() if not t.ended]


def new_state(nodes: list[str], config: Config = Config()) -> State:
    return State(config, {name: NodeView(name) for name in nodes})


def snapshot(state: State, wall: float) -> Snapshot:
    """A copy of what the watcher knows, as the dashboard and --json show it."""
    ranks = sorted((replace(t.view, history=list(t.view.history)) for t in state.ranks.values()),
                   key=lambda v: (v.rank is None, v.rank if v.rank is not None else 0, v.node, v.pid))
    d = state.diagnosis
    if d is not None and d.waited is not None and state.counting is not None and state.counting[0] is d:
        d = replace(d, waited=round(wall - state.counting[1], 1))     # a wait that goes on, as long as it is now
    return Snapshot(time=wall, threshold=state.config.threshold, nodes=[replace(n) for n in state.nodes.values()],
                    ranks=ranks, diagnosis=d, incidents=list(state.incidents),
                    messages=list(state.messages[-20:]))


def details(state: State) -> dict:
    """What an incident bundle keeps beyond the snapshot: each node's agent hello (versions)
    and each rank's environment (secrets redacted) and command line."""
    return {"nodes": {name: {k: v for k, v in vars(h).items()} for name, h in state.hello.items()},
            "ranks": {f"{n}:{p}": {"argv": list(t.info.argv) if t.info else None,
                                   "env": t.info.env if t.info else None,
                                   "master": t.info.master if t.info else None}
                      for (n, p), t in state.ranks.items()}}


def remember(state: State, text: str) -> None:
    state.messages.append(text)
    del state.messages[:-MESSAGES]


def say(kind: EventKind, text: str, **data) -> Say:
    """The effect that says an event."""
    return Say(Event(kind, text, None, data))


def notice(state: State, text: str, out: list[Effect]) -> None:
    """A one-line notice, said once."""
    if text in state.messages:
        return
    remember(state, text)
    out.append(say(EventKind.NOTICE, text))
