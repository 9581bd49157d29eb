"""Why each rank of a run ended, and which endings no other ending explains: the culprits of a
run that ended. Pure: a function of each rank's `Ending`.

Each ending is read by its mechanism, from the strongest evidence at hand:
1. the rank's own record of how its script ended (node/rank_bootstrap.py's PID.end, under
   `--launch` or with `import ddp_preflight.hangwatch.flight`), written before Python's teardown: an uncaught
   exception (type, message, line), sys.exit's code, or a clean end, and when;
2. an exception in its output (hangwatch/tracebacks.py): a Gloo or NCCL error that says a peer or
   the link went away is a victim's; a stop's own (KeyboardInterrupt, elastic's SignalException)
   is read as the stop signal in 3.; any other is the rank's own;
3. its exit status: SIGKILL with its node's OOM-kill count risen is the OOM killer; SIGTERM,
   SIGINT or SIGHUP after a launcher began stopping its node (under `--launch`), or after a rank
   under the same launcher on its node ended (torchrun stops a node's ranks when one ends), is that
   stop; with no failure before it, someone stopped the run; any other signal (SIGKILL, SIGSEGV)
   and any exit code but 0 and 1 are the rank's own; code 1, SIGABRT and a code nobody could read
   are what both a rank's own error and a lost peer give: it cannot tell which;
4. ddp-preflight's own stop of every node: an end after it began (by more than the node's clock
   margin) that is not clean is that stop's, whatever else it shows (read()).

The culprits are the endings that no other ending explains: each rank's own failure; a clean exit
while its peers still ran, when a failure followed it (they lost it); failing both, the endings
that cannot tell which and that no ending before them explains. Endings on different nodes are
ordered on the master's clock with each node's clock error as the margin: two closer than their
margins cannot be ordered, and are candidates, not culprits. A victim (a lost peer, a launcher's
stop) is never a culprit. An ending that cannot tell which is explained by any own failure or
clean exit of the run, earlier or later: a rank's process outlives its departure by its teardown
(half a second and more with torch loaded), so its peers can be gone before it is."""

from __future__ import annotations

import enum
import signal
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ddp_preflight.node.protocol import ExitStatus
from ddp_preflight.rules.message_parts import STOPPED_TYPES

from .causes import CAUSES
from .model import Certainty, Diagnosis, Evidence, Kind, RankStatus, Reason, Seen, Unnumbered, Who, Word, label
from .tracebacks import from_record

KERNEL_ONLY = (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE)   # never sent by a launcher


class Role(enum.Enum):
    OWN = "own"                # it failed on its own
    CLEAN = "clean"            # it ended cleanly
    VICTIM = "victim"          # something else ended it: a lost peer, a launcher's stop
    EITHER = "either"          # its own failure or a victim's: the evidence cannot tell
    STOPPED = "stopped"        # stopped from outside with no failure before it: not a failure
    TEARDOWN = "teardown"      # its script ended cleanly; the process failed in its teardown after


@dataclass(frozen=True)
class Ending:
    """One rank's end, as the evidence shows it."""
    node: str
    pid: int | None                    # None: no process was seen (explain reads what a run left)
    rank: int | None = None
    at: float | None = None            # when it ended, on the master's clock: its record's time, else its exit's
    margin: float = 0.0                # how far `at` may be off the master's clock (its node's clock error)
    status: ExitStatus | None = None   # None: its parent reaped it before its code could be read
    record: dict | None = None         # its own record (PID.end)
    exception: Seen | None = None      # from its record, else its output
    quote: str | None = None           # the output line the exception rests on
    oom: bool | None = None            # its node's OOM-kill count rose as it ended
    stopped_by: StoppedBy | None = None   # the launcher that began stopping its node before it ended
    launcher: int | None = None        # the pid of its parent (torchrun): its siblings share it
    frame: str | None = None           # its last line seen alive (a stack)
    function: str | None = None
    leaving: bool | None = None        # it had closed connections of its own when a rank of its node first
                                       # ended (None: not known)
    closed_first: frozenset = frozenset()   # the ranks it closed a connection with first (the kernel's TIME_WAIT)
    closed_on: frozenset = frozenset()      # the ranks that closed a connection with it first
    peers: frozenset = frozenset()          # the ranks of its run whose connections are known
    peer_key: Who | None = None             # the rank its lost-peer error names (its endpoint)
    writer: str | None = None               # where a rank whose number is unknown was read (explain)

    @property
    def key(self) -> Who:
        return self.rank if self.rank is not None else Unnumbered(self.node or None, self.pid, self.writer)

    @property
    def label(self) -> str:
        return label(self.key)


@dataclass(frozen=True)
class Read:
    """An ending as read: its role and reason, how sure, and what it rests on."""
    ending: Ending
    role: Role
    reason: Reason
    certain: bool
    exception: Seen | None = None
    basis: tuple[str, ...] = ()        # what the judging read beyond the end itself (how it knew)


class StoppedBy(Word):
    """The launcher that began stopping a rank before it ended."""
    TORCHRUN = "torchrun"              # torchrun on its node: another rank of that node ended
    DDP_PREFLIGHT = "ddp-preflight"    # ddp-preflight on every node (Ctrl-C, a quit, --stop-on-hang, a failed node)


OUTSIDE = StoppedBy.DDP_PREFLIGHT     # stops every node of the run from outside: whatever ends after it
                                      # began is its doing


def stop_of(status: ExitStatus | None, node_stopped: bool, error_after_stop: bool = False, failed_first: bool = False,
            torchrun: bool = False) -> StoppedBy | None:
    """Who began stopping a launched rank before it ended, from what its launch recorded: the one
    rule for a launch's summary (launch/ends.py) and explain of its result.json (explain/records.py).
    ddp-preflight, when it stopped the rank's node and the rank ended by a signal a launcher sends
    (SIGTERM, SIGINT, SIGHUP; SIGKILL unless torchrun saw it fail before it began stopping the node,
    `failed_first`: a SIGKILL from outside) or lost a peer after its stop began; SIGABRT, SIGSEGV
    and the like are the rank's own. Else torchrun, when its launch program
    said it began stopping the rank."""
    # A stop signal on a stopped node is the stop's even when torchrun saw it first (the supervisor
    # ends the node's whole group); a SIGKILL torchrun saw before it began stopping came from outside.
    sent = status is not None and status.signal is not None and \
        (status.stopped or (status.signal == signal.SIGKILL and not failed_first))
    if node_stopped and (sent or error_after_stop):
        return OUTSIDE
    return StoppedBy.TORCHRUN if torchrun else None


def read(ending: Ending, endings: Sequence[Ending]) -> Read:
    """What one ending was, given the others of its run (for a sibling that ended before it). A
    rank that ended after ddp-preflight began stopping every node, and not cleanly, ended by that
    stop: killed by it, its peer killed by it (a lost peer), or a failure of its own that came
    after the run was already being stopped (a handler of SIGTERM that raises). Its own evidence
    stays on it; it is never the run's failure."""
    found = _read(ending, endings)
    if ending.stopped_by == OUTSIDE and found.role in (Role.OWN, Role.EITHER, Role.TEARDOWN):
        return replace(found, role=Role.VICTIM, reason=Reason.STOPPED_BY_LAUNCHER, certain=True,
                       basis=("it ended after ddp-preflight began stopping every node",))
    return found


def _read(ending: Ending, endings: Sequence[Ending]) -> Read:
    record, status, seen = ending.record or {}, ending.status, ending.exception
    how = record.get("how")
    if seen is None and how == "raised" and record.get("type"):
        seen = seen_in_record(record)
    if seen is not None and (how == "raised" or how is None):
        if seen.type.rsplit(".", 1)[-1] in STOPPED_TYPES:
            return _stopped(ending, endings, seen)      # Ctrl-C's KeyboardInterrupt, elastic's SignalException
        if seen.lost_peer:
            return Read(ending, Role.VICTIM, Reason.LOST_PEER, True, seen)
        return Read(ending, Role.OWN, Reason.RAISED, True, seen)
    if how in ("returned", "exit", "ended"):
        code = record.get("code") if how != "ended" else (status.code if status is not None else None)
        if code not in (None, 0):
            return Read(ending, Role.OWN, Reason.EXIT_CODE, True)
        if code == 0 and (status is None or status.ok):
            return Read(ending, Role.CLEAN, Reason.LEFT_FIRST, True)
        if code == 0:           # its script ended cleanly; the process did not
            return Read(ending, Role.TEARDOWN, Reason.FAILED, True)
    if status is None:
        return Read(ending, Role.EITHER, Reason.FAILED, False)
    if status.signal is not None:
        if status.signal == signal.SIGKILL and ending.oom:
            return Read(ending, Role.OWN, Reason.OOM_KILLED, True)
        if status.stopped:
            return _stopped(ending, endings)
        if ending.stopped_by is not None:
            return Read(ending, Role.VICTIM, Reason.STOPPED_BY_LAUNCHER, True)
        if status.signal == signal.SIGKILL:
            if _sibling_before(ending, endings):
                return Read(ending, Role.VICTIM, Reason.STOPPED_BY_LAUNCHER, False)
            return Read(ending, Role.OWN, Reason.KILLED, True)
        if status.signal in KERNEL_ONLY:
            return Read(ending, Role.OWN, Reason.KILLED, True)
        if status.signal == signal.SIGABRT:
            return Read(ending, Role.EITHER, Reason.FAILED, False)
        return Read(ending, Role.OWN, Reason.KILLED, False)
    if status.ok:
        return Read(ending, Role.CLEAN, Reason.LEFT_FIRST, True)
    if status.code == 1:
        return Read(ending, Role.EITHER, Reason.FAILED, False)
    return Read(ending, Role.OWN, Reason.EXIT_CODE, False)


def _stopped(ending: Ending, endings: Sequence[Ending], seen: Seen | None = None) -> Read:
    """A stop, by its signal (SIGTERM, SIGINT, SIGHUP) or by the exception a stop raises in the rank:
    a launcher's that began stopping its node, or torchrun's after a sibling ended, is that
    launcher's; with neither, someone stopped the run. Never the rank's own failure."""
    if ending.stopped_by is not None:
        return Read(ending, Role.VICTIM, Reason.STOPPED_BY_LAUNCHER, True, seen)
    if _sibling_before(ending, endings):
        return Read(ending, Role.VICTIM, Reason.STOPPED_BY_LAUNCHER, False, seen)
    return Read(ending, Role.STOPPED, Reason.TERMINATED, True, seen)


def seen_in_record(record: dict) -> Seen:
    """The exception of a PID.end record ("raised"), with the training's own innermost line."""
    info = from_record(record)
    if info is None:
        return Seen(str(record.get("type")), str(record.get("message") or ""), source="record")
    where = f"{info.file}:{info.line}" if info.file and info.line else None
    return Seen(info.type, info.message, where, info.function, info.lost_peer, info.peer, "record", info.cause,
                info.failure)


def _sibling_before(ending: Ending, endings: Sequence[Ending]) -> bool:
    """A rank under the same launcher on its node (one clock) ended before it: torchrun stops the
    node's other ranks when one ends."""
    if ending.launcher is None or ending.at is None:
        return False
    return any(e is not ending and e.node == ending.node and e.launcher == ending.launcher and e.at is not None
               and e.at < ending.at for e in endings)


def before(a: Ending, b: Ending) -> bool:
    """a ended before b for certain: on one node, by its clock; across nodes, by more than their
    clocks' margins."""
    if a.at is None or b.at is None:
        return False
    if a.node == b.node:
        return a.at < b.at
    return a.at + a.margin < b.at - b.margin


def judge(endings: Sequence[Ending], running: Sequence[Evidence] = (), unseen: Sequence[Evidence] = ()) \
        -> Diagnosis | None:
    """The verdict on a run's endings (`running`: its ranks still alive, as seen; `unseen`: ranks
    of the run whose end nothing shows, where what was read is not all there was: a run's logs,
    which list only the ranks that failed); None when nothing failed (every rank ended cleanly)
    or someone stopped the run first. The one rule for who failed first: the live watcher, a
    launch's summary and `ddp-preflight explain` all call it."""
    order = sorted(endings, key=lambda e: (e.at is None, e.at or 0.0))
    reads = [read(e, order) for e in order]
    failures = [r for r in reads if r.role in (Role.OWN, Role.EITHER, Role.VICTIM)]
    if not any(r.ending.status is not None or r.exception is not None or r.ending.record for r in failures):
        return None     # nothing says a rank failed: an end whose code nobody read is no failure by itself
    own = [r for r in reads if r.role is Role.OWN]
    left = [r for r in reads if r.role is Role.CLEAN and any(before(r.ending, f.ending) for f in failures)]
    candidates: list[Read] = []
    if own or left:
        culprits = left + own
        certainty = Certainty.CERTAIN if all(r.certain for r in culprits) else Certainty.LIKELY
        kernel = _closed_first_of(reads, any_role=True)
        if certainty is Certainty.LIKELY and kernel and [r.ending.key for r in culprits] == [kernel[0][0].ending.key]:
            # Its own code, and the kernel's word that it left first: certain.
            culprits = [replace(culprits[0], certain=True, basis=kernel[0][0].basis)]
            certainty = Certainty.CERTAIN
    else:
        if _stopped_first(reads, failures):
            return None     # someone stopped the run (Ctrl-C, a scheduler, the launcher) and the rest followed
        culprits, candidates, certainty = _named_by_victims(reads) or _closed_first_of(reads) or \
            _first_of(reads)
        if not culprits and not candidates and unseen and any(r.reason is Reason.LOST_PEER for r in reads):
            return _lost_unseen(reads, running, unseen)
    named = culprits or candidates
    reason = named[0].reason if named else Reason.LOST_PEER
    as_named = {r.ending.key: r for r in named}       # a read the judging refined (leaving)
    evidence = [_evidence(as_named.get(r.ending.key, r)) for r in reads] + list(running) + list(unseen)
    return Diagnosis(Kind.EXITED, tuple(sorted(r.ending.key for r in culprits)),
                     tuple(sorted(r.ending.key for r in candidates)), reason, certainty, tuple(evidence),
                     causes=CAUSES.get(reason, ()),
                     margin=max((r.ending.margin for r in candidates), default=0.0) if candidates else None)


def _lost_unseen(reads: Sequence[Read], running: Sequence[Evidence], unseen: Sequence[Evidence]) -> Diagnosis:
    """Ranks lost a peer, no end explains it, and nothing shows how some rank of the run ended
    (a rank that exits 0 is in no torchrun table and prints no error): that rank is the peer they
    lost, it left first; several such are candidates."""
    keys = sorted(e.key for e in unseen)
    one = len(keys) == 1
    named = [replace(e, reason=Reason.LEFT_FIRST) for e in unseen]
    evidence = [_evidence(r) for r in reads] + list(running) + named
    return Diagnosis(Kind.EXITED, tuple(keys) if one else (), () if one else tuple(keys), Reason.LEFT_FIRST,
                     Certainty.LIKELY if one else Certainty.UNSURE, tuple(evidence),
                     causes=CAUSES.get(Reason.LEFT_FIRST, ()))


def _stopped_first(reads: Sequence[Read], failures: Sequence[Read]) -> bool:
    """The first end was a stop (from outside, or a launcher's own stop with no rank failed before
    it) and no failure came before it: the run was stopped, not failed."""
    stops = [r for r in reads if r.role is Role.STOPPED or (r.reason is Reason.STOPPED_BY_LAUNCHER and r.certain)
             or r.ending.stopped_by == OUTSIDE]
    if not stops:
        return False
    real = [f for f in failures if f.reason is not Reason.STOPPED_BY_LAUNCHER and f.ending.stopped_by != OUTSIDE]
    if any(f.ending.at is None for f in real):
        return False          # a failure whose time nobody knows may have come first
    return not any(before(f.ending, stops[0].ending) for f in real)


def _named_by_victims(reads: Sequence[Read]) -> tuple[list[Read], list[Read], Certainty] | None:
    """The rank its victims' errors name: a Gloo or NCCL error that says a peer went away gives the
    peer's address, which is a rank's own endpoint. When every victim that names one names the same
    rank, that rank left first (whatever ended its process later)."""
    named = {r.ending.peer_key for r in reads if r.reason is Reason.LOST_PEER and r.ending.peer_key is not None}
    if len(named) != 1:
        return None
    key = named.pop()
    r = next((r for r in reads if r.ending.key == key), None)
    if r is None or r.role not in (Role.EITHER, Role.VICTIM, Role.CLEAN) or r.reason is Reason.LOST_PEER:
        return None
    victims = sorted(v.ending.key for v in reads if v.ending.peer_key == key)
    basis = (f"its peers' errors name it: {', '.join(label(v) for v in victims)} lost "
             f"{'its' if len(victims) == 1 else 'their'} connection to it",)
    return [_went_first(r, basis)], [], Certainty.CERTAIN


def _went_first(r: Read, basis: tuple[str, ...]) -> Read:
    """The rank that other evidence says went first, as its own end reads: a clean exit or its own
    failure as it was; an error code or SIGABRT that could have been a lost peer's is its own
    failure (it went first); an end not seen, or a launcher's stop, says only that it was leaving."""
    if r.role in (Role.CLEAN, Role.OWN):
        return replace(r, basis=basis)
    if r.role is Role.EITHER and r.ending.status is not None:
        return replace(r, role=Role.OWN, certain=True, basis=basis)
    return replace(r, reason=Reason.LEAVING, role=Role.OWN, certain=True, basis=basis)


def _closed_first_of(reads: Sequence[Read], any_role: bool = False) -> tuple[list[Read], list[Read], Certainty] | None:
    """The rank that closed its connections first, as the kernel says: it closed first with every
    other rank it was connected to, and none closed first with it. It left before any of them,
    whatever the order in which their processes ended (a teardown outlasts its victims'). None
    when the kernel's word names no single rank (a connection reset leaves no TIME_WAIT)."""
    first = [r for r in reads if r.ending.closed_first and not r.ending.closed_on
             and r.ending.peers and r.ending.closed_first >= r.ending.peers]
    if len(first) != 1 or (not any_role and first[0].role not in (Role.EITHER, Role.VICTIM, Role.CLEAN)):
        return None
    r = first[0]
    basis = (f"it closed its connections with ranks {','.join(map(str, sorted(r.ending.closed_first)))} before they "
             "closed theirs (the kernel's TIME_WAIT on its side)",)
    return [_went_first(r, basis)], [], Certainty.CERTAIN


def _first_of(reads: Sequence[Read]) -> tuple[list[Read], list[Read], Certainty]:
    """No rank failed on its own: the endings that cannot tell which and that no other ending
    explains, (culprits, candidates, how sure). One alone is the first to go; several that no
    clock can order, or a first one whose sibling torchrun stopped while it was already leaving
    (it had closed connections itself: it may have been the first to go, its own end unseen),
    are candidates. A candidate with which another rank closed a connection first (the kernel's
    TIME_WAIT on that rank's side) did not leave first: it is set aside while one remains.
    A sibling's own closed connections, read when the agent saw the first end, never order the two:
    the agent sees an end a sample after it, and a lost peer closes its connections within that
    sample (CI: rank 3's sys.exit ended in SIGABRT, rank 2 closed its own and was read as leaving
    first), and a SIGABRT or SIGSEGV can end a teardown as well as begin one."""
    either = [r for r in reads if r.role is Role.EITHER]
    first = [r for r in either if not any(before(o.ending, r.ending) for o in reads
                                          if o is not r and o.role is not Role.TEARDOWN)]
    leaving = [r for r in reads if r.role is Role.VICTIM and not r.certain and r.ending.leaving is not False
               and any(_siblings(f.ending, r.ending) for f in first)]
    candidates = first + leaving
    kept = [r for r in candidates if not r.ending.closed_on]
    if kept and len(kept) < len(candidates):
        closed_on = {o for r in candidates if r not in kept for o in r.ending.closed_on}
        basis = (f"{', '.join(label(k) for k in sorted(closed_on))} closed connections with the other "
                 "candidates first, not with it (the kernel's TIME_WAIT)",)
        candidates = [replace(r, basis=basis) for r in kept]
        if len(candidates) == 1:
            r = candidates[0]
            if r.role is Role.VICTIM:
                r = replace(r, reason=Reason.LEAVING, role=Role.OWN)
            return [r], [], Certainty.LIKELY
    if len(first) == 1 and not leaving:
        return first, [], Certainty.LIKELY
    # No rank to name at all (every end a lost peer's): its peer's node or the link went away, as
    # likely as the victims' words say; several that cannot be ordered: unsure which.
    return [], candidates, Certainty.UNSURE if candidates else Certainty.LIKELY


def _siblings(a: Ending, b: Ending) -> bool:
    return a.node == b.node and a.launcher is not None and a.launcher == b.launcher


def evidence_of(r: Read) -> Evidence:
    """A rank's Evidence as its ending was read."""
    return _evidence(r)


def _evidence(r: Read) -> Evidence:
    e = r.ending
    seen = r.exception
    frame = seen.where if seen is not None and seen.where else e.frame
    function = seen.function if seen is not None and seen.where else e.function
    exit = e.status
    notes: tuple[str, ...] = ()
    code = (e.record or {}).get("code")
    if (e.record or {}).get("how") in ("exit", "returned") and isinstance(code, int):
        recorded = ExitStatus(code=code)          # what the script chose, before its teardown
        if exit is not None and exit != recorded:
            notes = (f"its process ended with {exit}",)
        exit = recorded
    return Evidence(e.node, e.pid, e.rank, RankStatus.EXITED, r.reason, frame=frame, function=function, exit=exit,
                    ended_at=e.at, exception=seen, quote=e.quote, notes=r.basis + notes, writer=e.writer,
                    named_by=r.basis[0] if r.basis else None)

