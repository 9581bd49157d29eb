"""What all ranks together say when progress has stopped: a deadlock, a mismatch, a stall, a rank
stuck on its GPU, or a straggler (not a hang), as a typed verdict (model.Diagnosis).

Pure: a function of every rank's Evidence at the moment progress stopped (the reducer builds it
from the rank's stack, its kernel state, its helpers' CPU, its Flight Recorder and its sockets).
The text is rendered from the verdict (text.py); nothing here writes a sentence."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from node.protocol import StoreAnswer

from . import text
from .causes import CAUSES, TRAINS_ALONE
from .classify import GENERIC_WAITS
from .model import Certainty, Diagnosis, Evidence, Kind, Reason
from .model import RankStatus as S

# "running": it has used CPU since its stack was taken. Whatever it does, it is not stuck.
WORKING = (S.COMPUTING, S.COMPILING, S.LOADING_DATA, S.SAVING, S.RUNNING)
WAITING = (S.COLLECTIVE, S.GPU_WAIT)
P2P = "send/recv"


def verdict(**fields) -> Diagnosis:
    """A Diagnosis with its text rendered from its fields."""
    found = Diagnosis(**fields)
    return replace(found, summary=text.summary(found))


def working(e: Evidence) -> bool:
    """It does something that may arrive: it computes, compiles, saves or loads with CPU (its own
    or its workers'). A loader whose workers do nothing is stuck (its reason says so)."""
    return e.state in WORKING and e.reason is None


def stuck(e: Evidence) -> bool:
    """Neither working, nor waiting in a collective, nor gone, nor unseen: where it is, its reason
    says (left the loop, a lock, its data, I/O, stopped)."""
    return e.state not in WAITING and e.state not in (S.EXITED, S.UNKNOWN, S.RENDEZVOUS) and not working(e)


def diagnose(ranks: Mapping[int, Evidence], ended: Diagnosis | None = None) -> Diagnosis:
    """`ranks`: every rank's evidence, by key (rank, or negated pid). `ended`: the verdict on the
    ranks that exited (exits.judge), when some did."""
    evidence = tuple(e for _, e in sorted(ranks.items()))
    waiting = {r: e for r, e in ranks.items() if e.state in WAITING}
    busy = {r: e for r, e in ranks.items() if working(e)}
    exited = {r: e for r, e in ranks.items() if e.state is S.EXITED}
    unknown = {r: e for r, e in ranks.items() if e.state is S.UNKNOWN}
    halted = {r: e for r, e in ranks.items() if stuck(e)}
    if ranks and all(e.state is S.RENDEZVOUS for e in ranks.values()):
        return verdict(kind=Kind.RENDEZVOUS_STALL, culprits=tuple(sorted(ranks)), reason=Reason.CANNOT_CONNECT,
                       evidence=evidence, causes=CAUSES[Reason.CANNOT_CONNECT])
    if waiting and busy:
        return verdict(kind=Kind.STRAGGLER, culprits=tuple(sorted(busy)), reason=Reason.STRAGGLING,
                       evidence=evidence)
    if waiting and exited:
        if ended is not None and ended.named:
            return replace(ended, evidence=_merged(ended.evidence, evidence), summary=text.summary(
                replace(ended, evidence=_merged(ended.evidence, evidence))))
        return verdict(kind=Kind.EXITED, culprits=tuple(sorted(exited)), reason=Reason.FAILED,
                       certainty=Certainty.LIKELY, evidence=evidence, causes=CAUSES[Reason.FAILED])
    if waiting and halted:
        reason = _first_reason(halted)
        # Seen outside the collective the others wait in: certain, unless a rank nobody sees could be
        # the one (it is named beside them, "unknown").
        certainty = Certainty.CERTAIN if not unknown else Certainty.LIKELY
        behind = _behind_of(waiting, halted)
        return verdict(kind=Kind.DEADLOCK, culprits=tuple(sorted(halted)), reason=reason, certainty=certainty,
                       evidence=evidence, causes=CAUSES.get(reason, ()) + (CAUSES[Reason.BEHIND] if behind else ()))
    if waiting and unknown:
        # Only ranks nobody sees (no stack, node lost) could be holding the others up, and one of
        # them may be computing: never a culprit, never a hang that stops a run.
        return verdict(kind=Kind.UNSEEN, evidence=evidence, unknown_why=text.CANNOT_TELL)
    if waiting:
        return _all_waiting(waiting, evidence)
    if unknown:
        return verdict(kind=Kind.UNSEEN, evidence=evidence, unknown_why=text.CANNOT_TELL)
    return verdict(kind=Kind.NONE, evidence=evidence)


def _merged(first: Sequence[Evidence], rest: Sequence[Evidence]) -> tuple[Evidence, ...]:
    """The exits' evidence, then the live ranks' (one entry per rank)."""
    keys = {e.key for e in first}
    return tuple(first) + tuple(e for e in rest if e.key not in keys)


def _first_reason(ranks: Mapping[int, Evidence]) -> Reason:
    reasons = [e.reason for _, e in sorted(ranks.items()) if e.reason is not None]
    return reasons[0] if reasons else Reason.LEFT_LOOP


def _behind_of(waiting: Mapping[int, Evidence], others: Mapping[int, Evidence]) -> bool:
    """The Flight Recorder shows the others one collective (or more) behind the ranks that wait."""
    waits = {e.seq for e in waiting.values() if e.seq is not None}
    behind = [e.seq for e in others.values() if e.seq is not None]
    return bool(waits and behind) and max(behind) < min(waits)


def _all_waiting(waiting: Mapping[int, Evidence], evidence: tuple[Evidence, ...]) -> Diagnosis:
    """Every rank waits. Who is to blame: the ranks in another collective (a mismatch), the ranks at
    another collective number (the Flight Recorder), none in a cycle of receives with nothing in
    flight, the ranks on a GPU that makes no progress; else a peer or the link."""
    # A wait on an async handle (work.wait(), a future) is on some collective: it differs from
    # none. Only named collectives can disagree.
    named = {r: e for r, e in waiting.items() if e.state is S.COLLECTIVE and e.op not in GENERIC_WAITS}
    apart = _odd_ones_out({r: e.op for r, e in named.items()})
    if apart is not None:
        odd, tied = apart
        return verdict(kind=Kind.MISMATCH, culprits=odd, candidates=tied, reason=Reason.DIFFERENT_COLLECTIVE,
                       certainty=Certainty.CERTAIN if odd else Certainty.UNSURE, evidence=evidence,
                       causes=CAUSES[Reason.DIFFERENT_COLLECTIVE],
                       unknown_why=None if odd else "which one took the other branch cannot be told from where they "
                                                    "wait")
    numbered = {r: e.seq for r, e in waiting.items() if e.seq is not None}
    if len(numbered) == len(waiting):
        apart = _odd_ones_out(numbered)
        if apart is not None:
            odd, tied = apart
            return verdict(kind=Kind.MISMATCH, culprits=odd, candidates=tied, reason=Reason.BEHIND,
                           certainty=Certainty.CERTAIN if odd else Certainty.UNSURE, evidence=evidence,
                           causes=CAUSES[Reason.BEHIND],
                           unknown_why=None if odd else "as many ranks are at each collective number: which one "
                                                        "called one collective more or fewer cannot be told")
    on_gpu = sorted(r for r, e in waiting.items() if e.state is S.GPU_WAIT)
    if on_gpu:
        done = {r: waiting[r].completed for r in on_gpu}
        if len(on_gpu) > 1 and None not in done.values() and len(set(done.values())) > 1:
            # The rank behind: the others completed a collective it never did (Flight Recorder).
            lowest = min(v for v in done.values() if v is not None)
            behind = tuple(r for r in on_gpu if done[r] == lowest)
            return verdict(kind=Kind.GPU_HANG, culprits=behind, reason=Reason.BEHIND, certainty=Certainty.LIKELY,
                           evidence=evidence, causes=CAUSES[Reason.WAITS_ON_GPU])
        return verdict(kind=Kind.GPU_HANG, culprits=tuple(on_gpu), reason=Reason.WAITS_ON_GPU,
                       evidence=evidence, causes=CAUSES[Reason.WAITS_ON_GPU])
    if all(e.op == P2P for e in waiting.values()) and all(e.unsent == 0 for e in waiting.values()) \
            and all(e.moved == 0 for e in waiting.values()):
        return verdict(kind=Kind.DEADLOCK, candidates=tuple(sorted(waiting)), reason=Reason.WAIT_FOR_EACH_OTHER,
                       certainty=Certainty.UNSURE, evidence=evidence, causes=CAUSES[Reason.WAIT_FOR_EACH_OTHER])
    if all(e.moved for e in waiting.values()):
        return verdict(kind=Kind.SLOW, reason=Reason.LINK, evidence=evidence)
    return verdict(kind=Kind.NETWORK_STALL, reason=Reason.LINK, evidence=evidence, causes=CAUSES[Reason.LINK])


def _odd_ones_out(where: Mapping[int, object]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(culprits, candidates) when the ranks are at more than one place: the ranks at the place
    fewest ranks are at; or, when two places hold as many ranks each (where they stand does not say
    which diverged), no culprit and the ranks of those places as candidates. None when every rank is
    at one place."""
    places: dict[object, list[int]] = {}
    for r, place in where.items():
        places.setdefault(place, []).append(r)
    if len(places) < 2:
        return None
    fewest = min(len(rs) for rs in places.values())
    odd = [rs for rs in places.values() if len(rs) == fewest]
    if len(odd) > 1:
        return (), tuple(sorted(r for rs in odd for r in rs))
    return tuple(sorted(odd[0])), ()


# -- rendezvous: who never checked in --------------------------------------------------------

def rendezvous_stall(ranks: Mapping[int, Evidence], store: StoreAnswer | None,
                     planned: Mapping[int, str] = {}) -> Diagnosis | None:   # noqa: B006 (read only)
    """Ranks wait in init_process_group: who never checked in, as their store says (never without
    it). None when no rank waits there. A rank's node is in its evidence; a rank no agent found is
    placed by `planned` (rank -> node, the launch plan's), or is on a node unknown."""
    waiting = sorted(r for r, e in ranks.items() if e.state is S.RENDEZVOUS)
    if not waiting:
        return None
    evidence = tuple(e for _, e in sorted(ranks.items()))
    others = {r: e for r, e in ranks.items() if r not in waiting}
    busy = {r: e for r, e in others.items() if working(e)}
    if store is None or store.error or not store.checked_in or not store.world_size:
        # Who is missing cannot be told: say what is seen, and why the store did not say more.
        why = ("the store was not read" if store is None else
               f"the store at {store.master} could not be read ({store.error})" if store.error else
               f"the store at {store.master} holds no rank's check-in (with NCCL it never does)"
               if not store.checked_in else "the world size is unknown")
        if busy:
            return verdict(kind=Kind.STRAGGLER, culprits=tuple(sorted(busy)), reason=Reason.STRAGGLING,
                           evidence=evidence)
        if not others and (store is None or store.error):
            return _store_unanswered(ranks, waiting, store)
        if not others:
            return verdict(kind=Kind.RENDEZVOUS_STALL, culprits=tuple(waiting), reason=Reason.CANNOT_CONNECT,
                           evidence=evidence, unknown_why=why, causes=CAUSES[Reason.CANNOT_CONNECT])
        return verdict(kind=Kind.RENDEZVOUS_STALL, evidence=evidence, certainty=Certainty.UNSURE,
                       unknown_why=why + ", so who never checked in cannot be told")
    checked = set(store.checked_in)
    missing = [r for r in range(store.world_size) if r not in checked and r not in waiting]
    late = [r for r in waiting if r not in checked]      # waiting, yet not checked in
    if missing and all(r in busy for r in missing):
        return verdict(kind=Kind.STRAGGLER, culprits=tuple(sorted(busy)), reason=Reason.STRAGGLING, evidence=evidence)
    if missing:
        unfound = tuple(Evidence(planned.get(r, ""), 0, r, S.UNKNOWN, notes=("no agent found it",))
                        for r in missing if r not in ranks)
        marked = tuple(replace(e, reason=Reason.CANNOT_REACH_STORE) if e.key in late else e for e in evidence)
        return verdict(kind=Kind.RENDEZVOUS_STALL, culprits=tuple(missing), reason=Reason.NEVER_CHECKED_IN,
                       certainty=Certainty.CERTAIN, evidence=marked + unfound, store=store.master,
                       causes=CAUSES[Reason.NEVER_CHECKED_IN])
    if late:
        return verdict(kind=Kind.RENDEZVOUS_STALL, culprits=tuple(late), reason=Reason.CANNOT_REACH_STORE,
                       certainty=Certainty.CERTAIN, evidence=evidence, store=store.master,
                       causes=CAUSES[Reason.CANNOT_REACH_STORE])
    return verdict(kind=Kind.RENDEZVOUS_STALL, culprits=tuple(waiting), reason=Reason.CANNOT_CONNECT,
                   certainty=Certainty.CERTAIN, evidence=evidence, store=store.master,
                   causes=CAUSES[Reason.CANNOT_CONNECT])


def _store_unanswered(ranks: Mapping[int, Evidence], waiting: Sequence[int], store: StoreAnswer | None) -> Diagnosis:
    """Every rank waits in init_process_group and their store gave no answer: where they stand
    cannot be told (a store that accepts and never answers, a store gone, or a process that only
    claims to be a rank and points at such a store). They are unknown, never culprits, and this
    is not a hang: nothing names them, writes a bundle or stops a run for them."""
    where = store.master if store is not None and store.master else "?"
    why = ("its store was not read" if store is None else
           f"no answer from its store at {where}" if store.silent else
           f"its store at {where} could not be read: {store.error}")
    unknown = tuple(replace(e, state=S.UNKNOWN, reason=None, op=None, notes=(f"waits in init_process_group; {why}",))
                    if r in waiting else e for r, e in sorted(ranks.items()))
    return verdict(kind=Kind.UNSEEN, evidence=unknown, certainty=Certainty.UNSURE,
                   unknown_why="who is missing cannot be told without the store's answer")


def trains_alone(ranks: Sequence[Evidence], world: int, seconds: float) -> Diagnosis:
    """Every rank of a world of more than one has worked for `seconds` without a connection."""
    return verdict(kind=Kind.ALONE, evidence=tuple(ranks), world=world, waited=seconds, causes=TRAINS_ALONE,
                   certainty=Certainty.CERTAIN)


def connected_late(ranks: Sequence[int]) -> str:
    """What takes back trains_alone(): some of those ranks have a connection now."""
    return f"{text.who(ranks)} connected after all: a process group was created late"
