"""A verdict's words, rendered from its fields (model.Diagnosis): the one-line summary of each kind
and the launch summary's headline. The words of ends and of failures' own words are in
ended_text.py, those of ranks, places and causes in words.py. Pure; nothing decides from these
strings, and no decision module imports this one (tests/unit/test_layers.py)."""

from __future__ import annotations

from . import ended_text, sequence
from .model import Basis, Diagnosis, Evidence, Kind, Reason, Who, label
from .model import RankStatus as S
from .waiting import CANNOT_TELL  # the why of a verdict that cannot tell (a decision's data)
from .words import at, by_key, byte_count, describe, note_line, ops, wait, who


def summary(d: Diagnosis) -> str:
    """The verdict in one line, from its fields: the words of what named it (a failure's own words,
    the ranks lined up by sequence number) or of its kind; then what preflight said of its nodes."""
    if d.basis is Basis.WORDS:
        text = ended_text.named(d)
    elif d.basis is Basis.SEQUENCE:
        text = ended_text.never_entered(d)
    else:
        render = RENDER.get(d.kind)
        text = render(d) if render else f"{d.kind.value}"
    if d.notes:
        text += f"; preflight said of {'; '.join(note_line(n) for n in d.notes)}"
    return text


def _waiting(d: Diagnosis) -> list[Evidence]:
    return [e for e in d.evidence if e.state in (S.COLLECTIVE, S.GPU_WAIT)]


def _unknown(d: Diagnosis) -> str:
    """The ranks nobody sees, grouped by why: "ranks 2,3 unknown (not watched: worker1's agent is gone)"."""
    why: dict[str, list[Who]] = {}
    for e in d.evidence:
        if e.state is S.UNKNOWN:
            why.setdefault(e.unseen or "not seen", []).append(e.key)
    return "; ".join(f"{who(keys)} unknown ({reason})" for reason, keys in why.items())


def _flight(d: Diagnosis) -> str:
    """Where each rank is in the sequence of collectives ("ranks 0,2 at all_reduce #1235, rank 1 at
    all_reduce #1234"), from the Flight Recorder."""
    at_seq: dict[tuple, list[Who]] = {}
    for e in d.evidence:
        if e.seq is not None and e.rank is not None:
            at_seq.setdefault((e.seq, e.seq_op or "collective"), []).append(e.rank)
    if not at_seq:
        return ""
    parts = [f"{'rank' if len(rs) == 1 else 'ranks'} {','.join(map(str, sorted(rs)))} at {op} #{seq}"
             for (seq, op), rs in sorted(at_seq.items(), key=lambda kv: (-len(kv[1]), kv[0][0]))]
    return "; Flight Recorder: " + ", ".join(parts)


STUCK = {
    Reason.LEFT_LOOP: "left the loop: {where}",
    Reason.WAITS_ON_LOCK: "waits on a lock outside any collective: {where}",
    Reason.SLEEPS: "sleeps outside any collective: {where}",
    Reason.IDLE_IN_LOOP: "is idle inside its loop, outside any collective: {where}",
    Reason.WAITS_TO_RECEIVE: "waits to receive on {op} outside any collective: {where}",
    Reason.WAITS_FOR_DATA: "waits for its data: {where}, and its DataLoader workers do nothing",
    Reason.WAITS_ON_IO: "waits on I/O in the kernel (state D): {where}",
    Reason.STOPPED: "is stopped (SIGSTOP or a debugger: the kernel's state T){where_at}",
    Reason.BEHIND: "never entered the collective the others wait in: {where}",
}


def _deadlock(d: Diagnosis) -> str:
    waiting = _waiting(d)
    if d.reason is Reason.WAIT_FOR_EACH_OTHER:
        return (f"{wait([e.key for e in waiting])} in {ops(waiting)} and nothing is in flight on their "
                "connections: each waits to receive from another and none sends (a cycle of receives in the "
                "program, not the network)")
    by = by_key(d)
    parts = []
    for key in d.culprits:
        e = by[key]
        where = describe(e) if e.state is not S.STOPPED else f"stopped{at(e)}"
        form = STUCK.get(e.reason or Reason.LEFT_LOOP, STUCK[Reason.LEFT_LOOP])
        parts.append(f"{e.label} " + form.format(where=where, where_at=at(e), op=e.op or "a connection"))
    if any(e.state is S.UNKNOWN for e in d.evidence):
        parts.append(_unknown(d))
    return f"{'; '.join(parts)}; {wait([e.key for e in waiting])} in {ops(waiting)}" + _flight(d)


def _held(d: Diagnosis) -> str:
    bound = f"; a hang if it lasts {d.bound:.0f} s" if d.bound is not None else ""
    return f"{_deadlock(d)}; likely a stall ({d.waited or 0:.0f} s so far), which may end by itself{bound}"


def _skipped_group(d: Diagnosis) -> str:
    """"rank 1 never entered all_reduce #7 of group [0,1], where rank 0 waits; rank 1 waits in
    all_reduce #12 of the default group (hang_train.py:190)"."""
    if d.group is None:
        return _skipped_group_by_connections(d)
    joined = sequence.by_group(d.evidence)
    group = joined.get(d.group or "")
    by = by_key(d)
    there = (f"{group.op} #{group.seq}" if group else "a collective") + f" of {_group_name(d.group, d.group_ranks)}"
    waiting = f", where {wait(list(group.waiting))}" if group and group.waiting else ""
    elsewhere = []
    for key in d.culprits:
        e = by[key]
        g = next((g for g in e.groups if g.last), None)
        if g is not None:
            members = joined[g.group].members if g.group in joined else ()
            elsewhere.append(f"{e.label} waits in {g.op} #{g.seq} of {_group_name(g.group, members)}"
                             + (f" ({e.frame})" if e.frame else ""))
    return f"{who(d.culprits)} never entered {there}{waiting}" + "".join(f"; {w}" for w in elsewhere)


def _skipped_group_by_connections(d: Diagnosis) -> str:
    """"rank 1 never entered all_reduce of group [0,1] (hang_train.py:188), where rank 0 waits;
    rank 1 waits in all_reduce at hang_train.py:150 (train_step) with ranks 2,3 (the group is
    the ranks' own: a second mesh of Gloo connections joins its members)"."""
    by = by_key(d)
    members = set(d.group_ranks)
    inside = [e for e in d.evidence if e.key in members and e.key not in d.culprits and e.state is S.COLLECTIVE]
    there = f"{inside[0].op} of group [{','.join(map(str, d.group_ranks))}]" if inside else \
        f"a collective of group [{','.join(map(str, d.group_ranks))}]"
    frame = f" ({inside[0].frame})" if inside and inside[0].frame else ""
    elsewhere = [by[k] for k in d.culprits]
    others = sorted({e.key for e in d.evidence if e.key not in members and elsewhere and e.frame == elsewhere[0].frame},
                    key=str)
    away = f"; {who(d.culprits)} {'waits' if len(d.culprits) == 1 else 'wait'} in {describe(elsewhere[0])}" + \
        (f" with {who(others)}" if others else "") if elsewhere else ""
    return (f"{who(d.culprits)} never entered {there}{frame}, where {wait([e.key for e in inside])}{away} (their "
            "connections show the group: a second mesh of Gloo connections joins its members; no Flight Recorder "
            "numbers its collectives)")


def _group_name(group: str | None, members) -> str:
    if group in sequence.DEFAULT or group is None:
        return "the default group"
    return f"group [{','.join(map(str, members))}]"


def _mismatch(d: Diagnosis) -> str:
    waiting = _waiting(d)
    if d.reason is Reason.SKIPPED_GROUP:
        return _skipped_group(d)
    if d.reason is Reason.BEHIND:
        places: dict[int, list[Who]] = {}
        for e in waiting:
            if e.seq is not None:
                places.setdefault(e.seq, []).append(e.key)
        where = ", ".join(f"{who(keys)} at #{seq}" for seq, keys in sorted(places.items()))
        head = f"ranks wait in {ops(waiting)} at different collective numbers: {where}"
        if not d.culprits:
            return f"{head}; {d.unknown_why}"
        return f"{head}: {who(d.culprits)} called {'one' if len(places) == 2 else 'a'} different number of collectives"
    named = [e for e in waiting if e.state is S.COLLECTIVE]
    if not d.culprits:
        return ("ranks wait in different collectives: " + "; ".join(f"{e.label} in {describe(e)}" for e in named)
                + f"; {d.unknown_why}")
    by = by_key(d)
    odd = [by[k] for k in d.culprits]
    rest = [e for e in named if e.key not in d.culprits]
    rest_frame = rest[0].frame if rest else None
    return (f"ranks wait in different collectives: {who(d.culprits)} {'is' if len(odd) == 1 else 'are'} in "
            f"{'; '.join(describe(e) for e in odd)}, while {wait([e.key for e in rest])} in {ops(rest)} "
            f"({rest_frame or 'library code'})" + _flight(d))


def _gpu_hang(d: Diagnosis) -> str:
    by = by_key(d)
    first = by[d.culprits[0]]
    still = f" for {d.waited:.0f} s" if d.waited else ""
    return (f"{wait(d.culprits)} on {'its GPU' if len(d.culprits) == 1 else 'their GPUs'} "
            f"({first.op}{' at ' + first.frame if first.frame else ''}) and no rank makes progress{still}: "
            "a GPU kernel that never ends")


def _network_stall(d: Diagnosis) -> str:
    waiting = _waiting(d)
    unsent = [e for e in waiting if e.unsent]
    said = (f"every rank waits in {ops(waiting)} and none computes: a peer or the link is gone")
    if unsent:
        said += "; " + ", ".join(f"{e.label} has {byte_count(e.unsent or 0)} sent and not acknowledged" for e in unsent)
    return said + _flight(d)


def _slow(d: Diagnosis) -> str:
    waiting = _waiting(d)
    return (f"every rank waits in {ops(waiting)} and none computes, but they still move bytes "
            f"({', '.join(f'{e.label} {byte_count(e.moved or 0)}' for e in waiting)} since they stopped using CPU): "
            "a slow collective, not a hang")


def _straggler(d: Diagnosis) -> str:
    by = by_key(d)
    waiting = [e for e in d.evidence if e.state in (S.COLLECTIVE, S.GPU_WAIT, S.RENDEZVOUS)]
    rendezvous = any(e.state is S.RENDEZVOUS for e in waiting)
    busy = ", ".join(f"{by[k].label}{_node_of(by[k]) if rendezvous else ''} is {describe(by[k])}" for k in d.culprits)
    share = (f"; the waiting ranks were idle {d.idle_share:.0%} of the last {d.idle_span} s"
             if d.idle_share is not None else "")
    if d.every is not None:       # paused again at one line and went on (paused.py)
        share = (f"; {who(d.culprits)} held them up there again, {d.every:.0f} s after its last pause said, and "
                 "went on each time: a slow rank (a straggler)")
    return f"not a hang: {wait([e.key for e in waiting])} in {ops(waiting)} while {busy}{share}"


def _node_of(e: Evidence) -> str:
    return f" ({e.node}'s)" if e.node else ""


def _endless(d: Diagnosis) -> str:
    by = by_key(d)
    waiting = _waiting(d)
    work = "; ".join(f"{by[k].label} has computed for {d.waited or 0:.0f} s at "
                     f"{f'{by[k].frame} ({by[k].function})' if by[k].frame else 'an unknown line'}"
                     for k in d.culprits)
    return (f"{work} and never reaches {ops(waiting) or 'the collective'}, where "
            f"{_label_list([e.key for e in waiting])} wait{'s' if len(waiting) == 1 else ''} "
            f"(over {d.bound or 0:.0f} s: a straggler would have arrived)")


def _label_list(keys: list[Who]) -> str:
    numbered = sorted(k for k in keys if isinstance(k, int))
    return ("rank " if len(numbered) == 1 else "ranks ") + ",".join(map(str, numbered)) if numbered else "the others"


def _stall(d: Diagnosis) -> str:
    idle = [e.key for e in d.evidence if e.state is not S.EXITED]
    unknown = [e.key for e in d.evidence if e.state is S.UNKNOWN]
    return (f"{', '.join(label(k) for k in sorted(idle))} have used no CPU for {d.waited or 0:.0f}+ s; stacks "
            f"unavailable for {', '.join(label(k) for k in sorted(unknown))}, so who is guilty cannot be told "
            "(see the notice for the fix)")


def _unseen(d: Diagnosis) -> str:
    waiting = _waiting(d)
    if waiting:
        return f"{wait([e.key for e in waiting])} in {ops(waiting)}; {_unknown(d)}: {d.unknown_why or CANNOT_TELL}"
    by_place: dict[str, list[Who]] = {}
    for e in d.evidence:
        if e.state not in (S.UNKNOWN, S.EXITED):
            by_place.setdefault(describe(e), []).append(e.key)
    seen_at = "".join(f"{who(keys)}: {what}; " for what, keys in by_place.items())
    return f"{seen_at}{_unknown(d)}: {d.unknown_why or CANNOT_TELL}"


def _alone(d: Diagnosis) -> str:
    steps = ""
    if d.reason is Reason.TRAINING:
        # Where its stacks found each rank: its own line of the step, once for ranks at the same one.
        seen = sorted({e.step for e in d.evidence if e.step})
        steps = f", each in a training step of its own ({'; '.join(seen)})"
    return (f"{who(e.key for e in d.evidence)} (world {d.world}) used CPU for {d.waited or 0:.0f} s without a single "
            f"TCP connection to the store or to each other{steps}: each rank trains alone: no process group was "
            "created (init_process_group skipped on CPU?)")


def _launchers(d: Diagnosis) -> str:
    """torchruns that wait for the other nodes' torchruns (no rank started)."""
    waiting = ", ".join(f"{e.node} (node rank {'?' if e.node_rank is None else e.node_rank} of {d.world or '?'})"
                        for e in d.evidence)
    missing = ",".join(map(str, d.node_ranks))
    if d.reason is Reason.DUPLICATE_NODE_RANK:
        claims: dict[int, list[str]] = {}
        for e in d.evidence:
            if e.node_rank is not None:
                claims.setdefault(e.node_rank, []).append(e.node)
        twice = "; ".join(f"{' and '.join(sorted(nodes))} both claim node rank {r}" for r, nodes in sorted(claims.items())
                          if len(nodes) > 1)
        return (f"the torchruns of the run at {d.store} number their nodes wrong: {twice} (of {d.world or '?'}), so "
                f"node rank{'s' if len(d.node_ranks) > 1 else ''} {missing} never comes and no rank starts "
                f"({d.waited or 0:.0f} s)")
    where = (f": {', '.join(d.nodes)} {'runs' if len(d.nodes) == 1 else 'run'} no torchrun of this run" if d.nodes
             else ": no watched node runs it")
    return (f"torchrun on {waiting} has started no rank for {d.waited or 0:.0f} s: it waits in its rendezvous at "
            f"{d.store} for the other nodes' torchrun; node rank{'s' if len(d.node_ranks) > 1 else ''} {missing} "
            f"never checked in{where}")


def _rendezvous(d: Diagnosis) -> str:
    if d.node_ranks:
        return _launchers(d)
    waiting = [e for e in d.evidence if e.state is S.RENDEZVOUS]
    where = f"{wait([e.key for e in waiting])} in init_process_group"
    by = by_key(d)
    if d.reason is Reason.NEVER_CHECKED_IN:
        late = [e.key for e in waiting if e.reason is Reason.CANNOT_REACH_STORE]
        return f"{_never_checked_in(d)}; {where}" + (f" ({who(late)} not checked in either)" if late else "")
    if d.reason is Reason.CANNOT_REACH_STORE:
        return (f"{who(d.culprits)} {'waits' if len(d.culprits) == 1 else 'wait'} in init_process_group without "
                f"having checked in to the store at {d.store}: it cannot reach the store? (ddp-preflight's "
                "master-reachable); every other rank checked in")
    if d.reason is Reason.CANNOT_CONNECT and d.store:
        return (f"every rank checked in to the store at {d.store}, yet {where}: the ranks cannot connect to each "
                "other: check the firewall, address family and interface (ddp-preflight's ephemeral-ports, "
                "address-family, interface-choice)")
    if d.reason is Reason.CANNOT_CONNECT:
        why = f" ({d.unknown_why})" if d.unknown_why else ""
        return (f"every rank is stuck creating the process group{why}: check the firewall, address family and "
                "interface (ddp-preflight's ephemeral-ports, address-family, interface-choice)")
    seen = "; ".join(f"{by[e.key].label} is {describe(e)}" for e in d.evidence if e.state is not S.RENDEZVOUS)
    return f"{where}; {seen}; {d.unknown_why}"


def _never_checked_in(d: Diagnosis) -> str:
    """"ranks 2,3 never checked in (worker1's): rank 3 is idle at train.py:12 (main)", by node."""
    by = by_key(d)
    by_node: dict[str, list[Who]] = {}
    for r in d.culprits:
        node = by[r].node if r in by else ""
        by_node.setdefault(node, []).append(r)
    parts = []
    for node, keys in by_node.items():
        owner = f"{node}'s" if node else "node unknown: no agent found it"
        seen = [f"{'it' if len(keys) == 1 else who([r])} {_doing(by[r])}" for r in keys
                if r in by and by[r].state is not S.UNKNOWN]
        parts.append(f"{who(keys)} never checked in ({owner})" + (f": {', '.join(seen)}" if seen else ""))
    return "; ".join(parts)


def _doing(e: Evidence) -> str:
    return f"exited ({e.exit})" if e.state is S.EXITED and e.exit else f"is {describe(e)}"


RENDER = {
    Kind.DEADLOCK: _deadlock, Kind.HELD: _held,
    Kind.MISMATCH: _mismatch, Kind.GPU_HANG: _gpu_hang, Kind.NETWORK_STALL: _network_stall,
    Kind.SLOW: _slow, Kind.STRAGGLER: _straggler, Kind.ENDLESS: _endless, Kind.STALL: _stall, Kind.UNSEEN: _unseen,
    Kind.ALONE: _alone, Kind.RENDEZVOUS_STALL: _rendezvous, Kind.EXITED: ended_text.exited,
    Kind.NONE: lambda d: "no hang: no rank waits in a collective",
}


def headline(d: Diagnosis) -> str:
    """The verdict's first clause: who, and why (an exit's without the ranks that followed)."""
    if d.kind is Kind.EXITED:
        return ended_text.exit_head(d) + "".join(f"; preflight said of {note_line(n)}" for n in d.notes[:1])
    return summary(d)
