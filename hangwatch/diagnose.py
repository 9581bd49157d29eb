"""What all ranks together say: a deadlock, a mismatch, a stall, or a straggler (not a hang).

Pure: a function of every rank's state at the moment progress stopped."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from node.protocol import StoreAnswer

from .classify import GENERIC_WAITS, RankState
from .model import Diagnosis, Kind
from .model import RankStatus as S

LIKELY_DEADLOCK = ("uneven data across ranks: one rank ran out of batches and left the loop "
                   "(compare shards with ddp-preflight's data-shards check)",
                   "rank-dependent code: an `if rank == ...` around a collective")


MISMATCH_CAUSES = ("rank-dependent code: a collective only some ranks call (`if rank == 0: ...`), "
                   "or a different number of collectives per rank",
                   "ranks disagree on a branch: compare the code and data across nodes (ddp-preflight "
                   "code-parity and data-shards)")


GPU_HANG_CAUSES = ("an NCCL collective's kernel waits for a peer that never sends (a rank that left, a "
                   "mismatched collective on another node, a dead link): NCCL's kernels spin on the GPU",
                   "a kernel of the training's own that never ends (a loop on the device)")


CANNOT_TELL = "a hang cannot be told from a straggler"

CANNOT_CONNECT = ("check the firewall, address family and interface (ddp-preflight's ephemeral-ports, "
                  "address-family, interface-choice)")

NEVER_CHECKED_IN = ("it never called init_process_group: a condition around it, or it exited or is stuck "
                    "before it (its line above)",
                    "its node's torchrun did not start it: see that node's log")

TRAINS_ALONE = ("init_process_group behind a condition: nanochat, for one, creates its process group on CUDA "
                "only, so on CPU it needs its Gloo patch",
                "a script written for one process, started by torchrun: it never calls init_process_group")

# "running": it has used CPU since its stack was taken. Whatever it does, it is not stuck.
WORKING = (S.COMPUTING, S.COMPILING, S.LOADING_DATA, S.SAVING, S.RUNNING)


def diagnose(ranks: dict[int, RankState]) -> Diagnosis:
    waiting = {r: s for r, s in ranks.items() if s.state in (S.COLLECTIVE, S.GPU_WAIT)}
    working = {r: s for r, s in ranks.items() if s.state in WORKING}
    exited = {r: s for r, s in ranks.items() if s.state is S.EXITED}
    if all(s.state is S.RENDEZVOUS for s in ranks.values()) and ranks:
        return Diagnosis(Kind.RENDEZVOUS_STALL, "every rank is stuck creating the process group: check the "
                         "firewall, address family and interface (ddp-preflight's ephemeral-ports, "
                         "address-family, interface-choice)", tuple(sorted(ranks)))
    if waiting and working:
        who = ", ".join(f"rank {r} is {s.describe()}" for r, s in sorted(working.items()))
        return Diagnosis(Kind.STRAGGLER, f"not a hang: {_wait(waiting)} in "
                         f"{_ops(waiting)} while {who}", tuple(sorted(working)))
    if waiting and exited:
        return Diagnosis(Kind.EXITED, f"{_who(exited)} exited ({'; '.join(s.evidence[0] for s in exited.values())}) "
                         f"while {_wait(waiting)} in {_ops(waiting)}", tuple(sorted(exited)))
    if waiting:
        others = {r: s for r, s in ranks.items() if r not in waiting}
        # A wait on an async handle (work.wait(), a future) is on some collective: it differs
        # from none. Only named collectives can disagree.
        named = {r: s for r, s in waiting.items() if s.state is S.COLLECTIVE and s.op not in GENERIC_WAITS}
        ops = {s.op for s in named.values()}
        if others:
            seen = {r: s for r, s in others.items() if s.state is not S.UNKNOWN}
            if not seen:
                # Only ranks nobody sees (no stack, node lost) could be holding the others up, and
                # one of them may be computing: never a culprit, never a hang that stops a run.
                return Diagnosis(Kind.UNSEEN, f"{_wait(waiting)} in {_ops(waiting)}; {_unknown(others)}: {CANNOT_TELL}")
            where = "; ".join(f"{_who([r])} left the loop: {s.describe()}" for r, s in sorted(seen.items()))
            if len(seen) < len(others):
                where += f"; {_unknown(others)}"
            return Diagnosis(Kind.DEADLOCK, f"{where}; {_wait(waiting)} in {_ops(waiting)}",
                             tuple(sorted(seen)), LIKELY_DEADLOCK)
        if len(ops) > 1:
            # The odd ones out: the ranks in the collective fewest ranks are in.
            by_op = {op: sorted(r for r, s in named.items() if s.op == op) for op in ops}
            odd = min(by_op.values(), key=len)
            if sum(len(rs) == len(odd) for rs in by_op.values()) > 1:
                # As many in one as in another: where they stand does not say which one diverged.
                return Diagnosis(Kind.MISMATCH, "ranks wait in different collectives: " + "; ".join(
                    f"{_who([r])} in {s.describe()}" for r, s in sorted(named.items()))
                    + "; which one took the other branch cannot be told from where they wait", (), MISMATCH_CAUSES)
            rest = sorted(set(named) - set(odd))
            rest_frame = named[rest[0]].frame
            return Diagnosis(Kind.MISMATCH, f"ranks wait in different collectives: "
                             f"{_who(odd)} {'is' if len(odd) == 1 else 'are'} in "
                             f"{'; '.join(named[r].describe() for r in odd)}, while "
                             f"{_wait(rest)} in {_ops({r: named[r] for r in rest})} "
                             f"({rest_frame.where if rest_frame else 'library code'})",
                             tuple(odd), MISMATCH_CAUSES)
        on_gpu = sorted(r for r, s in waiting.items() if s.state is S.GPU_WAIT)
        if on_gpu:
            first = waiting[on_gpu[0]]
            return Diagnosis(Kind.GPU_HANG, f"{_wait(on_gpu)} on {'its GPU' if len(on_gpu) == 1 else 'their GPUs'} "
                             f"({first.op}{' at ' + first.frame.where if first.frame else ''}) and no rank computes: "
                             "a GPU kernel that never ends", tuple(on_gpu), GPU_HANG_CAUSES)
        return Diagnosis(Kind.NETWORK_STALL, f"every rank waits in {_ops(waiting)} and none computes: a peer or "
                         "the link is gone", tuple(sorted(waiting)))
    if any(s.state is S.UNKNOWN for s in ranks.values()):
        by_place: dict[str, list[int]] = {}
        for r, s in sorted(ranks.items()):
            if s.state not in (S.UNKNOWN, S.EXITED):
                by_place.setdefault(s.describe(), []).append(r)
        seen_at = "".join(f"{_who(rs)}: {what}; " for what, rs in by_place.items())
        return Diagnosis(Kind.UNSEEN, f"{seen_at}{_unknown(ranks)}: {CANNOT_TELL}")
    return Diagnosis(Kind.NONE, "no hang: no rank waits in a collective")


def rendezvous_stall(ranks: dict[int, RankState], store: StoreAnswer | None,
                     nodes: Mapping[int, str]) -> Diagnosis | None:
    """Ranks wait in init_process_group: who never checked in, as their store says (never
    without it), and on which node (`nodes`: rank -> node, from the agents and the launch plan).
    None when no rank waits there."""
    waiting = sorted(r for r, s in ranks.items() if s.state is S.RENDEZVOUS)
    if not waiting:
        return None
    others = {r: s for r, s in ranks.items() if r not in waiting}
    working = {r: s for r, s in others.items() if s.state in WORKING}
    where = f"{_wait(waiting)} in init_process_group"
    if store is None or store.error or not store.checked_in or not store.world_size:
        # Who is missing cannot be told: say what is seen, and why the store did not say more.
        why = ("the store was not read" if store is None else
               f"the store at {store.master} could not be read ({store.error})" if store.error else
               f"the store at {store.master} holds no rank's check-in (with NCCL it never does)"
               if not store.checked_in else "the world size is unknown")
        if working:
            return _busy_before_init(where, working, nodes)
        if not others:
            return Diagnosis(Kind.RENDEZVOUS_STALL, f"every rank is stuck creating the process group ({why}): "
                             f"{CANNOT_CONNECT}", tuple(waiting))
        seen = "; ".join(f"{_who([r])} is {s.describe()}" for r, s in sorted(others.items()))
        return Diagnosis(Kind.RENDEZVOUS_STALL, f"{where}; {seen}; {why}, so who never checked in cannot be told")
    checked = set(store.checked_in)
    missing = [r for r in range(store.world_size) if r not in checked and r not in waiting]
    late = [r for r in waiting if r not in checked]      # waiting, yet not checked in
    if missing and all(r in working for r in missing):
        return _busy_before_init(where, working, nodes)
    if missing:
        late_note = f" ({_who(late)} not checked in either)" if late else ""
        return Diagnosis(Kind.RENDEZVOUS_STALL, f"{_never_checked_in(missing, ranks, nodes)}; {where}{late_note}",
                         tuple(missing), NEVER_CHECKED_IN)
    if late:
        return Diagnosis(Kind.RENDEZVOUS_STALL, f"{_who(late)} {'waits' if len(late) == 1 else 'wait'} in "
                         f"init_process_group without having checked in to the store at {store.master}: it cannot "
                         "reach the store? (ddp-preflight's master-reachable); every other rank checked in",
                         tuple(late))
    return Diagnosis(Kind.RENDEZVOUS_STALL, f"every rank checked in to the store at {store.master}, yet {where}: "
                     f"the ranks cannot connect to each other: {CANNOT_CONNECT}", tuple(waiting))


def _never_checked_in(missing: list[int], ranks: dict[int, RankState], nodes: Mapping[int, str]) -> str:
    """"ranks 2,3 never checked in (worker1's): rank 3 is idle at train.py:12 (main)", by node."""
    by_node: dict[str, list[int]] = {}
    for r in missing:
        by_node.setdefault(nodes.get(r) or "", []).append(r)
    parts = []
    for node, rs in by_node.items():
        owner = f"{node}'s" if node else "node unknown: no agent found it"
        seen = [f"{'it' if len(rs) == 1 else _who([r])} {_doing(ranks[r])}" for r in rs
                if r in ranks and ranks[r].state is not S.UNKNOWN]
        parts.append(f"{_who(rs)} never checked in ({owner})" + (f": {', '.join(seen)}" if seen else ""))
    return "; ".join(parts)


def _doing(state: RankState) -> str:
    return f"exited ({state.evidence[0]})" if state.state is S.EXITED and state.evidence else f"is {state.describe()}"


def _busy_before_init(where: str, working: dict[int, RankState], nodes: Mapping[int, str]) -> Diagnosis:
    """A rank outside init_process_group still works: it may get there yet. Not a hang."""
    who = ", ".join(f"{_who([r])}{_on(r, nodes)} is {s.describe()}" for r, s in sorted(working.items()))
    return Diagnosis(Kind.STRAGGLER, f"not a hang: {where} while {who}", tuple(sorted(working)))


def _on(rank: int, nodes: Mapping[int, str]) -> str:
    return f" ({nodes[rank]}'s)" if rank in nodes else ""


def trains_alone(ranks: Sequence[int], world: int, seconds: float) -> Diagnosis:
    """Every rank of a world of more than one has worked for `seconds` without a connection."""
    return Diagnosis(Kind.ALONE, f"{_who(ranks)} (world {world}) used CPU for {seconds:.0f} s without a single TCP "
                     "connection to the store or to each other: each rank trains alone: no process group was "
                     "created (init_process_group skipped on CPU?)", (), TRAINS_ALONE)


def connected_late(ranks: Sequence[int]) -> str:
    """What takes back trains_alone(): some of those ranks have a connection now."""
    return f"{_who(ranks)} connected after all: a process group was created late"


def _unknown(ranks: dict[int, RankState]) -> str:
    """The ranks nobody sees, grouped by why: "ranks 2,3 unknown (not watched: worker1's agent is gone)"."""
    why: dict[str, list[int]] = {}
    for r, s in sorted(ranks.items()):
        if s.state is S.UNKNOWN:
            why.setdefault(s.evidence[0] if s.evidence else "no stack", []).append(r)
    return "; ".join(f"{_who(rs)} unknown ({reason})" for reason, rs in why.items())


def _who(ranks) -> str:
    """Ranks by number; a rank whose number is unknown is keyed by its negated pid."""
    numbered, pids = sorted(r for r in ranks if r >= 0), sorted(-r for r in ranks if r < 0)
    parts = [("rank " if len(numbered) == 1 else "ranks ") + ",".join(map(str, numbered))] if numbered else []
    parts += [("pid " if len(pids) == 1 else "pids ") + ",".join(map(str, pids))] if pids else []
    return " and ".join(parts)


def _wait(ranks) -> str:
    return _who(ranks) + (" waits" if len(ranks) == 1 else " wait")


def _ops(waiting: dict[int, RankState]) -> str:
    return "/".join(sorted({f"the GPU ({s.op})" if s.state is S.GPU_WAIT else str(s.op) for s in waiting.values()}))
