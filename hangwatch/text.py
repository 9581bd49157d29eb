"""A verdict's text, rendered from its fields (model.Diagnosis): the one-line summary, and one line
per rank of evidence. Pure; nothing decides from these strings."""

from __future__ import annotations

import signal as signals
from collections.abc import Iterable, Sequence

from . import sequence
from .model import Diagnosis, Evidence, Kind, Reason
from .model import RankStatus as S

CANNOT_TELL = "a hang cannot be told from a straggler"


# -- ranks --------------------------------------------------------------------------------------

def who(keys: Iterable[int]) -> str:
    """Ranks by number; a rank whose number is unknown is keyed by its negated pid."""
    keys = list(keys)
    numbered, pids = sorted(r for r in keys if r >= 0), sorted(-r for r in keys if r < 0)
    parts = [("rank " if len(numbered) == 1 else "ranks ") + ",".join(map(str, numbered))] if numbered else []
    parts += [("pid " if len(pids) == 1 else "pids ") + ",".join(map(str, pids))] if pids else []
    return " and ".join(parts)


def wait(keys: Sequence[int]) -> str:
    return who(keys) + (" waits" if len(keys) == 1 else " wait")


def at(e: Evidence) -> str:
    return f" at {e.frame} ({e.function})" if e.frame else ""


def describe(e: Evidence) -> str:
    """Where a rank is: "all_reduce at train.py:88 (step)", "idle at train.py:80 (main)"."""
    if e.state is S.GPU_WAIT:
        return f"waiting on its GPU ({e.op}){at(e)}"
    if e.state is S.EXITED:
        return f"exited ({e.exit or 'its code unread'})"
    return f"{e.op if e.state is S.COLLECTIVE else e.state.value}{at(e)}"


def ops(ranks: Iterable[Evidence]) -> str:
    return "/".join(sorted({f"the GPU ({e.op})" if e.state is S.GPU_WAIT else
                            "init_process_group" if e.state is S.RENDEZVOUS else str(e.op) for e in ranks}))


def evidence_line(e: Evidence) -> str:
    """One rank as the verdict saw it, for the report and the dashboard."""
    what = describe(e)
    if e.reason is not None:
        what += f" [{e.reason.value}]"
    if e.exception is not None:
        what += f"; {e.exception.type}: {_first_line(e.exception.message)} ({e.exception.source})"
    if e.seq is not None:
        what += f"; last collective #{e.seq}"
    notes = "; ".join(e.notes)
    return f"{e.label} on {e.node}: {what}" + (f" ({notes})" if notes else "")


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:200] + ("..." if len(line) > 200 else "")


# -- the summary --------------------------------------------------------------------------------

def summary(d: Diagnosis) -> str:
    render = RENDER.get(d.kind)
    text = render(d) if render else f"{d.kind.value}"
    if d.notes:
        text += f"; preflight said of {'; '.join(d.notes)}"
    return text


def _by_key(d: Diagnosis) -> dict[int, Evidence]:
    return {e.key: e for e in d.evidence}


def _waiting(d: Diagnosis) -> list[Evidence]:
    return [e for e in d.evidence if e.state in (S.COLLECTIVE, S.GPU_WAIT)]


def _unknown(d: Diagnosis) -> str:
    """The ranks nobody sees, grouped by why: "ranks 2,3 unknown (not watched: worker1's agent is gone)"."""
    why: dict[str, list[int]] = {}
    for e in d.evidence:
        if e.state is S.UNKNOWN:
            why.setdefault(e.notes[0] if e.notes else "no stack", []).append(e.key)
    return "; ".join(f"{who(keys)} unknown ({reason})" for reason, keys in why.items())


def _flight(d: Diagnosis) -> str:
    """Where each rank is in the sequence of collectives ("ranks 0,2 at all_reduce #1235, rank 1 at
    all_reduce #1234"), from the Flight Recorder."""
    at_seq: dict[tuple, list[int]] = {}
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
    by = _by_key(d)
    parts = []
    for key in d.culprits:
        e = by[key]
        where = describe(e) if e.state is not S.STOPPED else f"stopped{at(e)}"
        form = STUCK.get(e.reason or Reason.LEFT_LOOP, STUCK[Reason.LEFT_LOOP])
        parts.append(f"{e.label} " + form.format(where=where, where_at=at(e)))
    if any(e.state is S.UNKNOWN for e in d.evidence):
        parts.append(_unknown(d))
    return f"{'; '.join(parts)}; {wait([e.key for e in waiting])} in {ops(waiting)}" + _flight(d)


def _mismatch(d: Diagnosis) -> str:
    waiting = _waiting(d)
    if d.reason is Reason.BEHIND:
        places: dict[int, list[int]] = {}
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
    by = _by_key(d)
    odd = [by[k] for k in d.culprits]
    rest = [e for e in named if e.key not in d.culprits]
    rest_frame = rest[0].frame if rest else None
    return (f"ranks wait in different collectives: {who(d.culprits)} {'is' if len(odd) == 1 else 'are'} in "
            f"{'; '.join(describe(e) for e in odd)}, while {wait([e.key for e in rest])} in {ops(rest)} "
            f"({rest_frame or 'library code'})" + _flight(d))


def _gpu_hang(d: Diagnosis) -> str:
    by = _by_key(d)
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
        said += "; " + ", ".join(f"{e.label} has {_bytes(e.unsent or 0)} sent and not acknowledged" for e in unsent)
    return said + _flight(d)


def _slow(d: Diagnosis) -> str:
    waiting = _waiting(d)
    return (f"every rank waits in {ops(waiting)} and none computes, but they still move bytes "
            f"({', '.join(f'{e.label} {_bytes(e.moved or 0)}' for e in waiting)} since they stopped using CPU): "
            "a slow collective, not a hang")


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _straggler(d: Diagnosis) -> str:
    by = _by_key(d)
    waiting = [e for e in d.evidence if e.state in (S.COLLECTIVE, S.GPU_WAIT, S.RENDEZVOUS)]
    rendezvous = any(e.state is S.RENDEZVOUS for e in waiting)
    busy = ", ".join(f"{by[k].label}{_node_of(by[k]) if rendezvous else ''} is {describe(by[k])}" for k in d.culprits)
    share = (f"; the waiting ranks were idle {d.idle_share:.0%} of the last {d.idle_span} s"
             if d.idle_share is not None else "")
    return f"not a hang: {wait([e.key for e in waiting])} in {ops(waiting)} while {busy}{share}"


def _node_of(e: Evidence) -> str:
    return f" ({e.node}'s)" if e.node else ""


def _endless(d: Diagnosis) -> str:
    by = _by_key(d)
    waiting = _waiting(d)
    work = "; ".join(f"{by[k].label} has computed for {d.waited or 0:.0f} s at "
                     f"{f'{by[k].frame} ({by[k].function})' if by[k].frame else 'an unknown line'}"
                     for k in d.culprits)
    return (f"{work} and never reaches {ops(waiting) or 'the collective'}, where "
            f"{_label_list([e.key for e in waiting])} wait{'s' if len(waiting) == 1 else ''} "
            f"(over {d.bound or 0:.0f} s: a straggler would have arrived)")


def _label_list(keys: list[int]) -> str:
    numbered = sorted(k for k in keys if k >= 0)
    return ("rank " if len(numbered) == 1 else "ranks ") + ",".join(map(str, numbered)) if numbered else "the others"


def _stall(d: Diagnosis) -> str:
    idle = [e.key for e in d.evidence if e.state is not S.EXITED]
    unknown = [e.key for e in d.evidence if e.state is S.UNKNOWN]
    return (f"{', '.join(_label(k) for k in sorted(idle))} have used no CPU for {d.waited or 0:.0f}+ s; stacks "
            f"unavailable for {', '.join(_label(k) for k in sorted(unknown))}, so who is guilty cannot be told "
            "(see the notice for the fix)")


def _label(key: int) -> str:
    return f"rank {key}" if key >= 0 else f"pid {-key}"


def _unseen(d: Diagnosis) -> str:
    waiting = _waiting(d)
    if waiting:
        return f"{wait([e.key for e in waiting])} in {ops(waiting)}; {_unknown(d)}: {CANNOT_TELL}"
    by_place: dict[str, list[int]] = {}
    for e in d.evidence:
        if e.state not in (S.UNKNOWN, S.EXITED):
            by_place.setdefault(describe(e), []).append(e.key)
    seen_at = "".join(f"{who(keys)}: {what}; " for what, keys in by_place.items())
    return f"{seen_at}{_unknown(d)}: {d.unknown_why or CANNOT_TELL}"


def _alone(d: Diagnosis) -> str:
    return (f"{who(e.key for e in d.evidence)} (world {d.world}) used CPU for {d.waited or 0:.0f} s without a single "
            "TCP connection to the store or to each other: each rank trains alone: no process group was created "
            "(init_process_group skipped on CPU?)")


def _launchers(d: Diagnosis) -> str:
    """torchruns that wait for the other nodes' torchruns (no rank started)."""
    waiting = ", ".join(f"{e.node} ({e.notes[0].split(', ', 1)[1] if e.notes else 'node rank ?'})" for e in d.evidence)
    missing = ",".join(map(str, d.node_ranks))
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
    by = _by_key(d)
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
    by = _by_key(d)
    by_node: dict[str, list[int]] = {}
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


# -- exits --------------------------------------------------------------------------------------

def signal_name(text: str | None) -> str:
    """"signal 9" -> "signal 9, SIGKILL"."""
    if not text or not text.startswith("signal "):
        return text or "its code unread"
    try:
        return f"{text}, {signals.Signals(int(text.split()[1])).name}"
    except ValueError:
        return text


ENDED = {
    Reason.RAISED: "raised {exception}",
    Reason.EXIT_CODE: "ended with {exit}",
    Reason.KILLED: "was killed ({signal})",
    Reason.OOM_KILLED: "was killed by the kernel's OOM killer ({signal}; its node's OOM-kill count rose)",
    Reason.LEFT_FIRST: "left first, while the others still ran ({exit})",
    Reason.LEAVING: "left first: {basis}; then its process ended ({signal})",
    Reason.FAILED: "ended first ({signal}), before any other rank: its own error or a lost peer, which its exit alone "
                   "cannot tell",
    Reason.LOST_PEER: "lost its peer ({exception})",
    Reason.STOPPED_BY_LAUNCHER: "was stopped by its launcher",
    Reason.TERMINATED: "was stopped ({signal})",
}
FOLLOWED = {Reason.LOST_PEER: "lost its peer", Reason.STOPPED_BY_LAUNCHER: "stopped by its launcher",
            Reason.FAILED: "{exit}", Reason.TERMINATED: "{exit}"}


def _on(e: Evidence) -> str:
    return f"{e.label} on {e.node}"


def _ended(e: Evidence) -> str:
    seen = e.exception
    exception = (f"{seen.type}: {_first_line(seen.message)}" + (f" at {seen.where}" if seen.where else "")
                 if seen is not None else "an exception")
    form = ENDED.get(e.reason or Reason.FAILED, ENDED[Reason.FAILED])
    if e.reason is Reason.FAILED and e.notes:       # what says it went first: its own failure
        form = "failed first ({signal}): {basis}"
    return form.format(exception=exception, exit=e.exit or "its code unread", signal=signal_name(e.exit),
                       basis=e.notes[0] if e.notes else "its own end unseen")


def _ended_in_order(d: Diagnosis) -> list[Evidence]:
    return sorted((e for e in d.evidence if e.state is S.EXITED), key=lambda e: (e.ended_at is None, e.ended_at or 0))


def _exit_head(d: Diagnosis) -> str:
    """Who ended first, and why; or why that cannot be told."""
    by = _by_key(d)
    ended = _ended_in_order(d)
    named = [by[k] for k in d.named if k in by]
    if d.culprits:
        head = "; ".join(f"{e.label} on {e.node} {_ended(e)}" for e in named)
    elif d.candidates:
        stopped = [e for e in named if e.reason is Reason.STOPPED_BY_LAUNCHER]
        first = [e for e in named if e not in stopped]
        head = f"{who(e.key for e in first)} ended first ({'; '.join(f'{_on(e)} {signal_name(e.exit)}' for e in first)})"
        if len(first) > 1:
            head += f", closer together than the nodes' clocks can order them (within {d.margin or 0:.3f} s)"
        if stopped:
            one = len(stopped) == 1
            head += (f"; {'; '.join(_on(e) for e in stopped)} {'was' if one else 'were'} stopped by torchrun right "
                     f"after, before {'its' if one else 'their'} own end could be seen ({'it' if one else 'each'} may "
                     "have been on its way out)")
        head += ": one of these went first; whether by its own error or a lost peer, the exits alone cannot tell"
    elif ended:
        head = (f"{ended[0].label} on {ended[0].node} {_ended(ended[0])} and no rank ended before it: its peer's node "
                "or the link went away")
    else:
        head = "ranks ended"
    return head


def _exited(d: Diagnosis) -> str:
    by = _by_key(d)
    ended = _ended_in_order(d)
    named = [by[k] for k in d.named if k in by]
    head = _exit_head(d)
    start = min((e.ended_at for e in named if e.ended_at is not None), default=None)
    if start is None and ended:
        start = ended[0].ended_at
    then = [f"{e.label} ({_followed(e)}{_delay(e, start)})" for e in ended if e.key not in d.named]
    live = [e.label for e in d.evidence if e.state is not S.EXITED]
    text = head + (f"; then {', '.join(then)}" if then else "") + (f"; still running: {', '.join(live)}" if live else "")
    if d.clocks_apart:
        text += (f" (the nodes' clocks are {d.clocks_apart:.1f} s apart: exit times are put on the master's clock)")
    return text


def _followed(e: Evidence) -> str:
    if e.reason in (Reason.RAISED, Reason.EXIT_CODE, Reason.KILLED, Reason.OOM_KILLED, Reason.LEFT_FIRST,
                    Reason.LEAVING):
        return _ended(e)
    form = FOLLOWED.get(e.reason or Reason.FAILED, "{exit}")
    return form.format(exit=e.exit or "its code unread")


def _delay(e: Evidence, start: float | None) -> str:
    return f", {e.ended_at - start:+.2f} s" if e.ended_at is not None and start is not None else ""


RENDER = {
    Kind.DEADLOCK: _deadlock, Kind.MISMATCH: _mismatch, Kind.GPU_HANG: _gpu_hang, Kind.NETWORK_STALL: _network_stall,
    Kind.SLOW: _slow, Kind.STRAGGLER: _straggler, Kind.ENDLESS: _endless, Kind.STALL: _stall, Kind.UNSEEN: _unseen,
    Kind.ALONE: _alone, Kind.RENDEZVOUS_STALL: _rendezvous, Kind.EXITED: _exited,
    Kind.NONE: lambda d: "no hang: no rank waits in a collective",
}


def headline(d: Diagnosis) -> str:
    """The verdict's first clause: who, and why (an exit's without the ranks that followed)."""
    if d.kind is Kind.EXITED:
        return _exit_head(d) + "".join(f"; preflight said of {note}" for note in d.notes[:1])
    return d.summary


# -- what a failure's own words named (`ddp-preflight explain`) --------------------------------------

NAMED = {
    Reason.ADDRESS_FAMILY: "{who} cannot connect to {their} peers: Gloo binds {basis} (ss1.ss_family == "
                           "ss2.ss_family)",
    Reason.PORT_IN_USE: "torchrun on {nodes} could not listen on the master port{port}: it is in use (EADDRINUSE); "
                        "no rank started",
    Reason.UNSUPPORTED: "{who} called what the backend does not implement: {exception}",
    Reason.SCRIPT_OPTIONS: "torchrun on {nodes} took the script's options for its own and stopped before any rank "
                           "started: {basis}",
    Reason.NCCL_ERROR: "{who} failed in NCCL: {exception}",
    Reason.OUT_OF_MEMORY: "{who} ran out of GPU memory: {exception}",
    Reason.TIMED_OUT: "{who} waited in {op} past the process group's timeout: {exception}",
    Reason.OOM_KILLED: "{who} {was} killed by the kernel's OOM killer ({basis})",
    Reason.LEFT_FIRST: "{who} left first: nothing says it failed or was stopped (an exit 0 is in no table), and "
                       "{basis}",
    Reason.LOST_PEER: "{basis}, and no rank's own failure is in what was read: a node or the link went away, or "
                      "the logs of the rank that left are not among the inputs",
    Reason.BEHIND: "{who} never reached the collective the others waited in: {basis}",
    Reason.CANNOT_REACH_STORE: "torchrun on {nodes} could not reach the rendezvous store{port}: {basis}",
    Reason.NEVER_CHECKED_IN: "torchrun on {nodes} waited for nodes that never joined its rendezvous{port}: {basis}",
}


def named(d: Diagnosis) -> str:
    """The summary of a verdict whose reason a failure's own words named."""
    by = _by_key(d)
    first = next((by[k] for k in d.named if k in by), None)
    seen = first.exception if first is not None else None
    exception = (f"{seen.type}: {_first_line(seen.message)}" + (f" at {seen.where}" if seen.where else "")
                 if seen is not None else "")
    many = len(d.named) > 1
    words = NAMED[d.reason] if d.reason in NAMED else "{who}: {exception}"
    port = f" {d.store}" if d.store else ""
    if d.reason in (Reason.CANNOT_REACH_STORE, Reason.NEVER_CHECKED_IN):
        port = f" at {d.store}" if d.store else ""
    text = words.format(who=who(d.named) or ", ".join(d.nodes) or "every rank", their="their" if many else "its",
                        was="were" if many else "was", nodes=", ".join(d.nodes) or "a node", port=port,
                        exception=exception, basis=(first.notes[0] if first is not None and first.notes
                                                    and d.reason is not Reason.BEHIND else d.unknown_why or ""),
                        op=(f"{first.op} #{first.seq}" if first is not None and first.op and first.seq is not None
                            else first.op if first is not None and first.op else "a collective"))
    if d.unknown_why and "{basis}" not in words:
        text += f"; {d.unknown_why}"
    others = [e for e in d.evidence if e.key not in d.named and e.reason is not None]
    if others:
        text += "; then " + ", ".join(f"{e.label} ({_followed(e)})" for e in others)
    return text


def never_entered(d: Diagnosis) -> str:
    """"rank 2 never entered all_reduce #1235, which ranks 0,1,3 issued at train.py:88": the verdict's
    ranks joined by sequence number (sequence.join)."""
    found = sequence.join(sequence.entered_from(d.evidence))
    return (joined(found) if found is not None else "") + (f"; {d.unknown_why}" if d.unknown_why else "")


def joined(j: sequence.Joined) -> str:
    """The ranks lined up by sequence number, in words: "rank 2 never entered all_reduce #12 (its
    last: #11 all_reduce; it was at train.py:80), which ranks 0,1,3 issued at train.py:88"; ranks
    behind at the same place are said once ("ranks 4-7 never entered ... (their last: ...)");
    with none behind, "ranks 0-63 all entered all_reduce #12 at train.py:88: none is behind"."""
    op = j.op or "the collective"
    issued_at = f" at {j.frame}" if j.frame else ""
    if not j.behind:
        return f"{ranks(j.ahead)} all entered {op} #{j.seq}{issued_at}: none is behind"
    places: dict[tuple, list[int]] = {}
    for e in j.entered:
        if e.rank in j.behind:
            places.setdefault((e.seq, e.op, e.frame), []).append(e.rank)
    parts = []
    for (seq, last_op, frame), behind in places.items():
        one = len(behind) == 1
        last = f" ({'its' if one else 'their'} last: #{seq}{' ' + last_op if last_op else ''}"
        last += f"; {'it was' if one else 'they were'} at {frame})" if frame else ")"
        parts.append(f"{ranks(behind)} never entered {op} #{j.seq}{last}")
    return f"{'; '.join(parts)}, which {ranks(j.ahead)} issued{issued_at}"


def ranks(numbers: Iterable[int]) -> str:
    """"rank 3", "ranks 0,1,3", "ranks 0-31,33-63"."""
    numbers = sorted(set(numbers))
    return ("rank " if len(numbers) == 1 else "ranks ") + ranges(numbers)


def ranges(numbers: Iterable[int]) -> str:
    """Rank numbers compressed: runs of three or more as first-last ("0-31,33-63"), shorter runs
    listed ("0,1,3"), so 64 ranks read in one line."""
    numbers = sorted(set(numbers))
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ",".join(f"{run[0]}-{run[-1]}" if len(run) >= 3 else ",".join(map(str, run)) for run in runs)
