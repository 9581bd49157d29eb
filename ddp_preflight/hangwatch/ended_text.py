"""The words of how a run's ranks ended (exits.py's verdicts: who went first, and why; the ranks
that followed), and of what a failure's own words named (`ddp-preflight explain`), rendered from a
verdict's fields. Pure; nothing decides from these strings."""

from __future__ import annotations

from . import sequence
from .model import Basis, Diagnosis, Evidence, Reason
from .model import RankStatus as S
from .words import by_key, first_line, ranks, signal_name, who

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
    return e.label + (f" on {e.node}" if e.node else "")     # a pasted log may not say its node


def _ended(e: Evidence) -> str:
    seen = e.exception
    exception = (f"{seen.type}: {first_line(seen.message)}" + (f" at {seen.where}" if seen.where else "")
                 if seen is not None else "an exception")
    form = ENDED.get(e.reason or Reason.FAILED, ENDED[Reason.FAILED])
    if e.reason is Reason.FAILED and e.named_by:    # what says it went first: its own failure
        form = "failed first ({signal}): {basis}"
    said = form.format(exception=exception, exit=e.exit or "its code unread", signal=signal_name(e.exit),
                       basis=e.named_by or "its own end unseen")
    if e.frame and e.reason in (Reason.KILLED, Reason.FAILED) and e.exception is None:
        said += f" at {e.frame}" + (f" ({e.function})" if e.function else "")     # faulthandler's line
    return said


def _ended_in_order(d: Diagnosis) -> list[Evidence]:
    return sorted((e for e in d.evidence if e.state is S.EXITED), key=lambda e: (e.ended_at is None, e.ended_at or 0))


def exit_head(d: Diagnosis) -> str:
    """Who ended first, and why; or why that cannot be told. A verdict a failure's own words named
    is said in those words (the port in use, the address family), without the ranks that followed."""
    if d.basis is Basis.WORDS:
        return named(d, followed=False)
    by = by_key(d)
    ended = _ended_in_order(d)
    shown = [by[k] for k in d.named if k in by]
    if d.culprits:
        head = "; ".join(f"{_on(e)} {_ended(e)}" for e in shown)
    elif d.candidates:
        stopped = [e for e in shown if e.reason is Reason.STOPPED_BY_LAUNCHER]
        first = [e for e in shown if e not in stopped]
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
        head = (f"{_on(ended[0])} {_ended(ended[0])} and no rank ended before it: its peer's node "
                "or the link went away")
    else:
        head = "ranks ended"
    return head


def exited(d: Diagnosis) -> str:
    by = by_key(d)
    ended = _ended_in_order(d)
    named = [by[k] for k in d.named if k in by]
    head = exit_head(d)
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


NAMED = {
    Reason.ADDRESS_FAMILY: "{who} cannot connect to {their} peers: Gloo binds {basis} (ss1.ss_family == "
                           "ss2.ss_family)",
    Reason.PORT_IN_USE: "torchrun on {nodes} could not listen on the master port{port}: it is in use (EADDRINUSE); "
                        "no rank started",
    Reason.UNSUPPORTED: "{who} called what the backend does not implement: {exception}",
    Reason.SIZE_MISMATCH: "the ranks issued collectives of different sizes: Gloo received more bytes than its "
                          "collective expected ({basis})",
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


def named(d: Diagnosis, followed: bool = True) -> str:
    """The summary of a verdict whose reason a failure's own words named (`followed`: and how the
    other ranks then ended)."""
    by = by_key(d)
    first = next((by[k] for k in d.named if k in by), None)
    seen = first.exception if first is not None else None
    exception = (f"{seen.type}: {first_line(seen.message)}" + (f" at {seen.where}" if seen.where else "")
                 if seen is not None else "")
    many = len(d.named) > 1
    words = NAMED[d.reason] if d.reason in NAMED else "{who}: {exception}"
    port = f" {d.store}" if d.store else ""
    if d.reason in (Reason.CANNOT_REACH_STORE, Reason.NEVER_CHECKED_IN):
        port = f" at {d.store}" if d.store else ""
    text = words.format(who=who(d.named) or ", ".join(d.nodes) or "every rank", their="their" if many else "its",
                        was="were" if many else "was", nodes=", ".join(d.nodes) or "a node", port=port,
                        exception=exception, basis=(first.named_by if first is not None and first.named_by
                                                    and d.reason is not Reason.BEHIND else d.unknown_why or ""),
                        op=(f"{first.op} #{first.seq}" if first is not None and first.op and first.seq is not None
                            else first.op if first is not None and first.op else "a collective"))
    text = text.removesuffix(": ")          # a template's {exception} where the ranks raised none (a watchdog line)
    if d.unknown_why and "{basis}" not in words:
        text += f"; {d.unknown_why}"
    others = [e for e in d.evidence if e.key not in d.named and e.reason is not None] if followed else []
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
