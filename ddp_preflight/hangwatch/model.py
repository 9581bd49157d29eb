"""What hangwatch knows about a run at one moment: the objects `hangwatch attach --json` prints
and the dashboard renders. Plain data; `to_json()` gives the contract's JSON form.

Its JSON form, field by field, is docs/hangwatch.md's "The JSON". A verdict (Diagnosis) is data
only: its words are rendered from its fields at the edge (text.py: the CLI, the dashboard, the
bundle, the launch summary, explain's renderer), and the JSON the CLI prints adds them there
(render.py).
"state": "running" means sampled but not yet classified from a stack (stacks are taken when
progress stops, and otherwise rarely).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, is_dataclass, replace

from ddp_preflight.node.protocol import ExitStatus
from ddp_preflight.rules.fix import Action, Fix

from .exit_json import exit_from_json
from .observed import InGroup, Seen  # noqa: F401  (part of the model: Evidence holds them)
from .who import Unnumbered, Who, label, who_from_json

HISTORY = 60


class Word(str, enum.Enum):
    """A closed set of words: compares equal to its word, and prints as it."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class NodeStatus(Word):
    CONNECTING = "connecting"     # its agent is starting
    WATCHING = "watching"
    LOST = "lost"                 # its agent stopped or went silent: its ranks are unknown
    ERROR = "error"               # its agent could not start


class RankStatus(Word):
    """What a rank is doing, in the user's words (classify.py decides it from the evidence)."""
    RUNNING = "running"           # sampled, using CPU, not yet looked at (or moved since its stack)
    COMPUTING = "computing"
    COLLECTIVE = "collective"     # waiting in one (its name is RankView.op)
    GPU_WAIT = "gpu-wait"         # its host thread waits for its GPU (cudaStreamSynchronize...)
    RENDEZVOUS = "rendezvous"     # creating the process group
    LOADING_DATA = "loading-data"
    COMPILING = "compiling"
    IMPORTING = "importing"       # running an installed module's import (its name is RankView.op)
    SAVING = "saving"
    IDLE = "idle"                 # no CPU, not in a collective: where it is, its line says
    STOPPED = "stopped"           # the kernel holds it (SIGSTOP, a debugger): /proc's state T or t
    EXITED = "exited"
    UNKNOWN = "unknown"           # not seen: no stack, or its node is lost


class Kind(Word):
    """What the ranks together say (diagnose.py). The hangs are the kinds that name a stop of
    progress with a culprit or a cause: they write a bundle and --stop-on-hang acts on them."""
    DEADLOCK = "deadlock"                   # a rank left the loop; the others wait for it
    MISMATCH = "mismatch"                   # ranks wait in different collectives
    NETWORK_STALL = "network-stall"         # every rank waits, none computes, no data flows
    RENDEZVOUS_STALL = "rendezvous-stall"   # every rank stuck creating the process group
    EXITED = "exited"                       # a rank failed, or left first: the first one to go
    ENDLESS = "endless"                     # a rank computes for far longer than its peers wait
    GPU_HANG = "gpu-hang"                   # ranks wait on a GPU that never finishes its work
    STALL = "stall"                         # no CPU anywhere, stacks unavailable: who cannot be told
    SLOW = "slow"                           # every rank waits, but data is still flowing
    STRAGGLER = "straggler"                 # a rank computes while the others wait: not a hang
    HELD = "held"                           # a rank in its own code (asleep, reading, on a disk) while the others
                                            # wait: likely a stall, not a hang until its bound passes
    UNSEEN = "unseen"                       # only ranks nobody sees could be to blame: not a hang
    ALONE = "alone"                         # ranks of one world never connect: each trains alone (not a hang)
    NONE = "none"

    @property
    def is_hang(self) -> bool:
        return is_hang(self)


HANGS = frozenset({Kind.DEADLOCK, Kind.MISMATCH, Kind.NETWORK_STALL, Kind.RENDEZVOUS_STALL, Kind.EXITED,
                   Kind.STALL, Kind.ENDLESS, Kind.GPU_HANG})


def stops(d: Diagnosis) -> bool:
    """Whether --stop-on-hang (launch) and --exit-on-hang (attach) act on a verdict: a hang said as
    certain, where the evidence excludes that the wait ends by itself. A likely one is said, with
    its bundle, and the run goes on."""
    return is_hang(d.kind) and d.certainty is Certainty.CERTAIN


def is_hang(kind: Kind | None) -> bool:
    """Whether a verdict of this kind is a hang: one rule for the watcher (a bundle, --stop-on-hang,
    hangwatch's exit code) and the dashboard's colours alike."""
    return kind in HANGS


class Basis(Word):
    """What named a verdict's reason, which says how its words go (text.summary)."""
    EVIDENCE = "evidence"     # the ranks' evidence of progress and of how they ended (the watcher's verdicts)
    WORDS = "words"           # a failure's own words (failures.py's catalogue: explain)
    SEQUENCE = "sequence"     # the ranks lined up by Flight Recorder sequence number (explain)


@dataclass
class NodeView:
    name: str
    status: NodeStatus = NodeStatus.CONNECTING
    message: str | None = None
    interface: str | None = None
    ranks: int = 0
    net_bytes_per_s: float | None = None


@dataclass
class RankView:
    node: str
    pid: int
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    cpu: float = 0.0
    history: list[float] = field(default_factory=list)
    state: RankStatus = RankStatus.RUNNING
    op: str | None = None
    frame: str | None = None
    function: str | None = None
    wchan: str | None = None
    waits_in: dict | None = None          # its main thread's blocking system call (node/blocked.py)
    idle_for: float = 0.0
    exit: ExitStatus | None = None        # how it ended (None: running, or its code was never read)
    last_line: str | None = None
    step: int | None = None
    step_rate: float | None = None
    stack: list[dict] | None = None
    flight: dict | None = None
    gpu: int | None = None                # the GPU it computes on (NVML), and that GPU's
    gpu_util: float | None = None         # utilization and memory activity, % of the last sample
    gpu_memory_util: float | None = None

    @property
    def key(self) -> Who:
        """As verdicts name it (Diagnosis.culprits)."""
        return self.rank if self.rank is not None else Unnumbered(self.node, self.pid)

    @property
    def label(self) -> str:
        return label(self.key)


class Reason(Word):
    """Why a rank is named (or why a victim ended as it did): a closed set, decided from evidence
    (diagnose.py for the live ranks, exits.py for the ended ones)."""
    # how a rank ended
    RAISED = "raised"                         # an uncaught exception of its own (its record or its output)
    EXIT_CODE = "exit-code"                   # it ended with a code of its own (sys.exit(3))
    FAILED = "failed"                         # an error code (1) or SIGABRT with nothing seen of why: its own
                                              # error or a lost peer, the exit alone cannot tell
    KILLED = "killed"                         # a signal no launcher sent (SIGKILL, SIGSEGV, ...)
    OOM_KILLED = "oom-killed"                 # SIGKILL while its node's OOM-kill count rose
    LEFT_FIRST = "left-first"                 # it exited cleanly while its peers ran; they failed after
    LEAVING = "leaving"                       # it was on its way out (its own connections closed) when the first
                                              # rank beside it died of it; torchrun then stopped it
    LOST_PEER = "lost-peer"                   # its error says it lost a peer or the link
    STOPPED_BY_LAUNCHER = "stopped-by-launcher"   # torchrun or ddp-preflight stopped it after another rank ended
    TERMINATED = "terminated"                 # SIGTERM/SIGINT/SIGHUP with no failure before: the run was stopped
    # where a live rank is stuck
    LEFT_LOOP = "left-loop"                   # idle outside any collective, at its own line
    SLEEPS = "sleeps"                         # asleep in the kernel (time.sleep) outside any collective
    IDLE_IN_LOOP = "idle-in-loop"             # idle at a line inside its loop, its wait not known: it may go on
    WAITS_TO_RECEIVE = "waits-to-receive"     # blocked reading a socket or a pipe outside any collective
    WAITS_ON_LOCK = "waits-on-lock"           # blocked on a lock, a condition or a queue, outside any collective
    WAITS_FOR_DATA = "waits-for-data"         # waits for a batch its DataLoader workers never bring
    WAITS_ON_IO = "waits-on-io"               # blocked in the kernel on a disk or a file system (state D)
    STOPPED = "stopped"                       # the kernel holds it: SIGSTOP, a debugger (state T or t)
    COMPUTES_FOREVER = "computes-forever"     # computes while the others wait, past any straggler's time
    WAITS_ON_GPU = "waits-on-gpu"             # its host thread waits for a GPU that makes no progress
    DIFFERENT_COLLECTIVE = "different-collective"   # it waits in another collective than the others
    BEHIND = "behind"                         # it never entered the collective the others wait in (sequence numbers)
    SKIPPED_GROUP = "skipped-group"           # it never entered a collective of a subgroup (new_group) that the group's
                                              # other ranks wait in, and waits in another group's (sequence numbers)
    WAIT_FOR_EACH_OTHER = "wait-for-each-other"     # every rank waits to receive and nothing is in flight
    NEVER_CHECKED_IN = "never-checked-in"     # the store has no key of it: it never reached init_process_group
    DUPLICATE_NODE_RANK = "duplicate-node-rank"   # two torchruns of one run claim one node rank: another never comes
    CANNOT_REACH_STORE = "cannot-reach-store"  # it waits in init_process_group, unregistered, while the others did
    CANNOT_CONNECT = "cannot-connect"         # every rank checked in and still they wait: they cannot connect
    LINK = "link"                             # every rank waits in one collective, none behind: a peer or the link
    STRAGGLING = "straggling"                 # it works while the others wait: not a hang
    TRAINING = "training"                     # in a training step of its own (backward, an optimizer's step)
                                              # with no connection: it trains alone
    # what a failure's own words name (hangwatch/failures.py; `ddp-preflight explain`)
    ADDRESS_FAMILY = "address-family"         # its Gloo binds another address family than its peers'
    PORT_IN_USE = "port-in-use"               # the store could not listen: the master port is taken
    UNSUPPORTED = "unsupported"               # it called what the backend does not implement
    SIZE_MISMATCH = "size-mismatch"           # Gloo received more bytes than its collective expected: different collectives
    SCRIPT_OPTIONS = "script-options"         # torchrun's parser took the script's options for its own
    NCCL_ERROR = "nccl-error"                 # NCCL refused: invalid usage, a duplicate GPU, a system error
    OUT_OF_MEMORY = "out-of-memory"           # CUDA ran out of memory on its GPU
    TIMED_OUT = "timed-out"                   # every rank waited in one collective past the timeout, none behind


class Certainty(Word):
    """How sure a verdict is of whom it names."""
    CERTAIN = "certain"      # the evidence says it outright: the rank's own record or error, the kernel's state,
                             # the store's keys, a signal only the kernel sends
    LIKELY = "likely"        # inferred: the order of exits, where one stack shows a rank, an exit code alone
    UNSURE = "unsure"        # the evidence leaves several ranks: the candidates, none named


@dataclass(frozen=True)
class Evidence:
    """One rank as a verdict saw it: where it is or how it ended, and what says so."""
    node: str
    pid: int | None                   # None: no process was seen (explain reads files)
    rank: int | None = None
    state: RankStatus = RankStatus.UNKNOWN
    reason: Reason | None = None      # what this rank did (a culprit's cause, or a victim's fate)
    op: str | None = None             # the collective or wait it is in; the CUDA call on a GPU wait
    frame: str | None = None          # its training code's innermost line: "train.py:88"
    function: str | None = None
    exit: ExitStatus | None = None    # how it ended: its code or its signal (None: not ended, or never read)
    ended_at: float | None = None     # when it ended, on the master's clock (epoch s)
    exception: Seen | None = None
    seq: int | None = None            # its last collective's sequence number (Flight Recorder)
    seq_op: str | None = None         # and that collective ("all_reduce")
    completed: int | None = None      # the last collective it saw complete (Flight Recorder)
    quote: str | None = None          # the output line it rests on
    moved: int | None = None          # bytes it read or wrote since it stopped using CPU (None: not known)
    unsent: int | None = None         # bytes it sent that its peers have not acknowledged (its sockets)
    notes: tuple[str, ...] = ()       # what else was seen: "CPU 0%", "waiting in the kernel at futex_do_wait"
    node_rank: int | None = None      # a torchrun that waits in its rendezvous: its node rank (of Diagnosis.world)
    groups: tuple[InGroup, ...] = ()  # where it is in each process group it has used (Flight Recorder)
    named_by: str | None = None       # what the judging read that gave it its reason (exits' basis, a failure's
                                      # words): said as its why, never read back from `notes` by position
    step: str | None = None           # the training step of its own its stack showed it in, where it trains alone
                                      # ("optimizer.step at train.py:88": alone.py)

    writer: str | None = None         # a rank whose number is unknown, as explain read it (Unnumbered.writer)
    unseen: str | None = None         # why nobody sees it (state unknown): "not watched: worker1's agent is gone"

    @property
    def key(self) -> Who:
        return self.rank if self.rank is not None else Unnumbered(self.node or None, self.pid, self.writer)

    @property
    def label(self) -> str:
        return label(self.key)


@dataclass(frozen=True)
class Cause:
    """A likely cause of a verdict's reason, in the user's words, and what fixes it: fixes are
    data (what to run or change, on which node), said by words.cause_line() at the edge."""
    what: str
    fixes: tuple[Fix, ...] = ()

    @classmethod
    def from_json(cls, data) -> Cause:
        """A bundle or result.json written before causes were typed holds each as its sentence."""
        if isinstance(data, str):
            return cls(data)
        return cls(str(data.get("what") or ""), tuple(Fix(Action(f["action"]), tuple(f.get("steps") or ()),
                                                          f.get("node"), f.get("note") or "")
                                                      for f in data.get("fixes") or ()))


@dataclass(frozen=True)
class NodeNote:
    """What preflight said of a node (under --launch): the clue beside a verdict on its ranks."""
    node: str
    said: str
    check: str | None = None          # the check that said it ("data-shards"): whether it is a clue (notes.py)


@dataclass(frozen=True)
class Diagnosis:
    """A verdict, as data: what kind; the ranks named (`culprits`) and the ranks it cannot tell apart
    (`candidates`: one of them, not all), kept apart; why (`reason`) and how sure (`certainty`);
    each rank as it was seen (`evidence`); the likely causes with their fixes. No text: its words
    are rendered from these fields at the edge (text.summary). Ranks are numbers; a rank whose
    number is unknown is an Unnumbered (what is known of it), never a made-up number."""
    kind: Kind
    culprits: Sequence[Who] = ()
    candidates: Sequence[Who] = ()
    reason: Reason | None = None
    certainty: Certainty = Certainty.LIKELY
    evidence: Sequence[Evidence] = ()
    causes: Sequence[Cause] = ()
    since: float | None = None        # when progress stopped or the first rank ended (epoch s), once reported
    nodes: Sequence[str] = ()         # nodes named, where a node is to blame (its launcher never came)
    node_ranks: Sequence[int] = ()    # node ranks that never checked in (a launcher's rendezvous)
    waited: float | None = None       # seconds the state named has lasted (computing for ever, idle)
    bound: float | None = None        # the bound it passed (endless: --endless-after)
    every: float | None = None        # a straggler that pauses again: seconds since its last pause said began
    idle_share: float | None = None   # a straggler's cost: the share of the last `idle_span` s the others waited
    idle_span: int | None = None
    clocks_apart: float | None = None   # seconds the nodes' clocks differ, when exits were put on one clock
    margin: float | None = None       # seconds within which exits on different nodes cannot be ordered
    world: int | None = None          # the world size, where the verdict is about all of it
    store: str | None = None          # the rendezvous store read (MASTER_ADDR:MASTER_PORT)
    unknown_why: str | None = None    # why whom to blame cannot be told, when it cannot
    notes: Sequence[NodeNote] = ()    # what preflight said of the named ranks' nodes (under --launch)
    basis: Basis = Basis.EVIDENCE     # what named its reason: how its words go
    group: str | None = None          # the process group (its id) whose collective the culprits never entered,
    group_ranks: Sequence[int] = ()   # and the ranks seen in it, where that is not the default group

    def as_reported(self, since: float) -> Diagnosis:
        """As a snapshot holds it: lists, as its JSON does, and since when."""
        return replace(self, culprits=list(self.culprits), candidates=list(self.candidates), causes=list(self.causes),
                       evidence=list(self.evidence), nodes=list(self.nodes), notes=list(self.notes), since=since)

    @property
    def named(self) -> tuple[Who, ...]:
        """The ranks to look at: the culprits, or failing them the candidates."""
        return tuple(self.culprits) or tuple(self.candidates)

    def to_json(self) -> dict:
        return _plain(self)

    @classmethod
    def from_json(cls, data: dict) -> Diagnosis:
        known = set(cls.__dataclass_fields__)
        values = {k: v for k, v in data.items() if k in known}
        values["kind"] = Kind(data["kind"])
        values["reason"] = Reason(data["reason"]) if data.get("reason") else None
        values["certainty"] = Certainty(data.get("certainty") or Certainty.LIKELY)
        values["evidence"] = [_evidence(e) for e in data.get("evidence") or ()]
        values["culprits"] = [who_from_json(w) for w in data.get("culprits") or ()]
        values["candidates"] = [who_from_json(w) for w in data.get("candidates") or ()]
        values["causes"] = [Cause.from_json(c) for c in data.get("causes") or ()]
        values["notes"] = [NodeNote(**n) if isinstance(n, dict) else NodeNote("", str(n)) for n in data.get("notes") or ()]
        values["basis"] = Basis(data.get("basis") or Basis.EVIDENCE)
        return cls(**values)


def _evidence(data: dict) -> Evidence:
    known = set(Evidence.__dataclass_fields__)
    values = {k: v for k, v in data.items() if k in known}
    values["state"] = RankStatus(data.get("state") or RankStatus.UNKNOWN)
    values["reason"] = Reason(data["reason"]) if data.get("reason") else None
    values["notes"] = tuple(data.get("notes") or ())
    values["exit"] = exit_from_json(data.get("exit"))
    values["groups"] = tuple(InGroup(**{**{k: v for k, v in g.items() if k in InGroup.__dataclass_fields__},
                                        "ranks": tuple(g.get("ranks") or ())})
                             for g in data.get("groups") or () if isinstance(g, dict) and "group" in g and "seq" in g)
    if data.get("exception"):
        values["exception"] = Seen(**{k: v for k, v in data["exception"].items() if k in Seen.__dataclass_fields__})
    return Evidence(**values)


@dataclass
class Snapshot:
    time: float
    threshold: float
    run: dict | None = None
    nodes: list[NodeView] = field(default_factory=list)
    ranks: list[RankView] = field(default_factory=list)
    diagnosis: Diagnosis | None = None
    incidents: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    preflight: dict | None = None

    def to_json(self) -> dict:
        return _plain(self)

    @classmethod
    def from_json(cls, data: dict) -> Snapshot:
        diagnosis = data.get("diagnosis")
        return cls(time=data["time"], threshold=data["threshold"], run=data.get("run"),
                   nodes=[NodeView(**{**n, "status": NodeStatus(n.get("status", "connecting"))})
                          for n in data.get("nodes", [])],
                   ranks=[RankView(**{**r, "state": RankStatus(r.get("state", "running")),
                                       "exit": exit_from_json(r.get("exit"))}) for r in data.get("ranks", [])],
                   diagnosis=Diagnosis.from_json(diagnosis) if diagnosis else None,
                   incidents=list(data.get("incidents", [])), messages=list(data.get("messages", [])),
                   preflight=data.get("preflight"))


_FIELDS: dict[type, tuple[str, ...]] = {}


def _plain(value):
    """As JSON holds it (dataclasses as objects, enums as their plain strings, tuples as lists), in one
    pass: asdict()'s deep copy of every rank's stack was most of a 4,096-rank bundle (issue 36)."""
    if isinstance(value, enum.Enum):
        return value.value
    if is_dataclass(value) and not isinstance(value, type):
        names = _FIELDS.get(type(value)) or _FIELDS.setdefault(type(value), tuple(f.name for f in fields(value)))
        return {name: _plain(getattr(value, name)) for name in names}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
