"""What the catalogued messages of a run's logs say failed, who and how sure (a Finding): pure, over
what messages.py read. In the order a run fails in: what names a cause by itself (a port in use, a
duplicate GPU, a mismatch report, an out-of-memory), then the store, then the collectives' timeouts
(watchdog.py: by process group), then how the launchers say the ranks ended, then a lost peer's
word. Each message's meaning and fix is the catalogue's (rules/failures.py); no fix for a cause not
seen, and a cause the logs cannot show is "unknown" with what to collect."""

from __future__ import annotations

import re
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from ddp_preflight.rules.failures import BY_ID, ENDED_FIXES, Cause, FailureKind, Sure
from ddp_preflight.rules.failures_nccl import RESULT_CAUSES, RESULT_NAMES
from ddp_preflight.rules.failures_stopped import REASONS
from ddp_preflight.rules.fix import Fix, run

from . import flight_text
from .messages import Hit, LauncherExit, Messages
from .quote import Quote
from .stacks import judged
from .watchdog import by_groups

QUOTES = 8
HOSTNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


@dataclass(frozen=True)
class Finding:
    """A run's failure as its messages show it."""
    kind: FailureKind
    cause: Cause
    culprits: tuple[int, ...] = ()
    sure: Sure = Sure.CERTAIN
    fix: Fix | None = None
    message: str | None = None              # the catalogue's id of the deciding message
    quotes: tuple[Quote, ...] = ()
    detail: dict = field(default_factory=dict)   # what the deciding words named: a port, two ranks, a group

    def to_json(self) -> dict:
        return {"kind": self.kind.value, "cause": self.cause.value, "culprits": list(self.culprits),
                "certainty": self.sure.value, "message": self.message, "fix": self.fix.text() if self.fix else None,
                "detail": self.detail}


# The messages that name a cause by themselves, in the order a run fails in (an earlier one is why a
# later one happened: a duplicate GPU is why NCCL said invalid usage).
ROOTS = ("node-ssh-unreachable", "libuv-not-built", "local-rank-option", "gloo-pair-bind", "store-port-in-use",
         "gloo-interface", "gloo-hostname", "address-family",
         "gloo-family-mismatch", "nccl-socket-family", "nccl-not-built", "no-cuda", "duplicate-gpu", "nccl-invalid-usage",
         "unused-parameters", "gloo-unsupported", "mismatch-report", "gloo-size-mismatch", "nccl-mismatched-collective",
         "cuda-oom",
         "host-oom", "dataloader-bus-error", "dataloader-killed", "dataloader-segfault", "dataloader-abort", "store-barrier",
         "store-barrier-uncounted",
         "nccl-rank-twice", "nccl-id-wait", "store-client-timeout", "store-connect-timeout", "gloo-connect", "nccl-connect",
         "store-wait-timeout", "nccl-system-error")
# ... and those that are the cause only when nothing above is in the logs: NCCL's return codes in its
# INFO lines, Gloo's loopback warning (harmless on one node), a victim's word on NCCL, monitored_barrier's
LATE = ("nccl-result-system", "gloo-loopback", "nccl-remote", "nccl-ib-completion", "nccl-cuda-failure", "nccl-error",
        "nccl-result", "monitored-barrier", "segfault", "abort", "fatal-signal")


def find(m: Messages) -> Finding | None:
    by: dict[str, list[Hit]] = {}
    for hit in m.hits:
        by.setdefault(hit.message.id, []).append(hit)
    for id in ROOTS:
        if id in by:
            return RULES.get(id, _plain)(by[id], m)
    analyzed = flight_text.judged(m.analyzed)     # torch's Flight Recorder analyzer: who the timeouts waited for
    if analyzed is not None:
        id, a = analyzed
        return Finding(a.kind, a.cause, a.culprits, a.sure, a.fix, id, tuple(q for b in m.analyzed for q in b.quotes)
                       [:QUOTES], a.detail)
    timeouts = [h for h in m.hits if h.message.id in ("watchdog", "watchdog-status")]
    if timeouts:
        return _timeouts(timeouts)
    if "nccl-remote" not in by:
        for id in ("nccl-timed-out", "gloo-timeout", "nccl-failed-or-timed-out", "watchdog-cut"):
            if id in by:       # no whole watchdog line: not which collective, nor who
                return _plain(by[id], m)
    ended = _ended(m.exits)
    if ended is not None:
        # the rank's own traceback says why it exited: by its rank's prefix (certain), or by the local index
        # its launcher gave it (mp.spawn's "-- Process 1 terminated with the following error:"), as sure as that
        own = [r for r in m.raised if ended.culprits and (r.rank == ended.culprits[0] or r.rank is None
                                                          and r.local_rank == ended.detail.get("local_rank") is not None)]
        if own and ended.kind is FailureKind.EXITED:
            sure = Sure.CERTAIN if own[-1].rank is not None else ended.sure
            return Finding(FailureKind.EXITED, Cause.PYTHON_EXCEPTION, ended.culprits, sure, None, None,
                           (own[-1].quote, *ended.quotes)[:QUOTES], {**ended.detail, "type": own[-1].type})
        return ended
    for id in LATE:
        if id in by:
            return RULES.get(id, _plain)(by[id], m)
    if m.raised:
        return _raised(m)
    stacks = judged(m.stacks)
    if stacks is not None:
        return Finding(stacks.kind, stacks.cause, stacks.culprits, stacks.sure, stacks.fix, "py-spy",
                       tuple(q for d in m.stacks for q in d.quotes[:1])[:QUOTES], stacks.detail)
    for id in (*REASONS, "stopped-by-hand", "scheduler-stopped", "stopped-from-outside", "launcher-killing",
               "launcher-stopping", "lost-peer"):
        if id in by:
            return _plain(by[id], m)
    if m.child_failed:       # torchrun's ChildFailedError, its table cut before any rank: a rank failed, not which
        return Finding(FailureKind.EXITED, Cause.UNKNOWN, (), Sure.UNKNOWN, ROOT_NOT_PASTED, None,
                       tuple(m.child_failed[:1]), {})
    return None


def _quotes(hits: list[Hit]) -> tuple[Quote, ...]:
    out: list[Quote] = []
    for hit in hits:
        if hit.quote not in out:
            out.append(hit.quote)
        if len(out) >= QUOTES:
            break
    return tuple(out)


def _plain(hits: list[Hit], m: Messages, culprits: tuple[int, ...] = (), sure: Sure | None = None,
           detail: dict | None = None, cause: Cause | None = None) -> Finding:
    message = hits[0].message
    return Finding(message.kind, cause or message.cause, culprits, sure or message.sure,
                   message.fix if cause in (None, message.cause) else None, message.id, _quotes(hits),
                   detail or dict(hits[0].found.groups))


def _raised(m: Messages) -> Finding:
    """Ranks' own uncaught exceptions (a traceback's last line) and nothing the catalogue knows:
    the rank that raised, when one did; several ranks raising the same say no one first."""
    ranks = {r.rank for r in m.raised}
    types = {r.type for r in m.raised}
    one = len(ranks) == 1 and None not in ranks
    return Finding(FailureKind.EXITED, Cause.PYTHON_EXCEPTION, (m.raised[0].rank or 0,) if one else (),
                   Sure.CERTAIN if one or len(types) == 1 else Sure.UNKNOWN, None, None,
                   tuple(r.quote for r in m.raised[:QUOTES]), {"type": sorted(types)})


def _ranks(hits: list[Hit]) -> set[int]:
    return {h.line.rank for h in hits if h.line.rank is not None}


def _oom(hits: list[Hit], m: Messages) -> Finding:
    """The ranks that ran out: by their rank prefix (certain); else the GPU the message names, taken
    as the rank on what is evidently one node (likely), certain when torchrun's line names that
    local rank's failure too."""
    ranks = _ranks(hits)
    if ranks:
        return _plain(hits, m, tuple(sorted(ranks)), Sure.CERTAIN)
    gpus = {int(h.found.groups["gpu"]) for h in hits if "gpu" in h.found.groups}
    placed = any(h.line.host is not None or h.line.local_rank is not None for h in hits)
    if len(gpus) == 1 and not placed:
        gpu = gpus.pop()
        failed = any(e.source == "failed-line" and e.local_rank == gpu for e in m.exits)
        return _plain(hits, m, (gpu,), Sure.CERTAIN if failed else Sure.LIKELY)
    return _plain(hits, m, (), Sure.LIKELY)


def _family(hits: list[Hit], m: Messages) -> Finding:
    """The ranks whose own family is not rank 0's (likely: the master's is taken as right); a
    message with no rank says the mix, not who."""
    own = {h.line.rank: int(h.found.groups["own"]) for h in hits if h.line.rank is not None}
    if 0 in own and len(own) > 1:
        odd = tuple(sorted(r for r, family in own.items() if family != own[0]))
        if odd:
            return _plain(hits, m, odd, Sure.LIKELY)
    return _plain(hits, m)


def _barrier(hits: list[Hit], m: Messages) -> Finding:
    """init_process_group's store barrier: fewer processes than the world never joined; more: the
    job was launched twice, or a store reused."""
    world, count = int(hits[-1].found.groups["world"]), int(hits[-1].found.groups["count"])
    cause = Cause.EXTRA_PROCESSES if count > world else Cause.NEVER_JOINED if count < world else Cause.UNKNOWN
    f = _plain(hits, m, detail={"world_size": world, "worker_count": count})
    return Finding(f.kind, cause, f.culprits, f.sure, f.fix, f.message, f.quotes, f.detail)


def _result(hits: list[Hit], m: Messages) -> Finding:
    """The code NCCL's calls returned (ncclResult_t): its cause, and the fix the catalogue has for that cause
    (a system error's, a remote peer's, an invalid usage's); one code of several: the first returned."""
    code = int(hits[0].found.groups.get("code") or hits[0].found.groups.get("code2") or 3)
    cause = RESULT_CAUSES.get(code, Cause.UNKNOWN)
    same = next((msg for msg in BY_ID.values() if msg.cause is cause and msg.kind is FailureKind.NCCL_ERROR), None)
    f = _plain(hits, m, cause=cause, detail={"result": RESULT_NAMES.get(code, str(code))})
    return Finding(f.kind, cause, f.culprits, f.sure, same.fix if same and cause is not Cause.UNKNOWN else f.fix or
                   hits[0].message.fix, f.message, f.quotes, f.detail)


def _prefixed(hits: list[Hit], m: Messages) -> Finding:
    """A message every rank may print: the ranks its prefixes name, when one alone said it (likely:
    the others' logs are not here)."""
    ranks = _ranks(hits)
    if len(ranks) == 1 and not any(h.line.rank is None for h in hits):
        return _plain(hits, m, tuple(ranks), Sure.LIKELY)
    return _plain(hits, m)


def _monitored(hits: list[Hit], m: Messages) -> Finding:
    """monitored_barrier names the rank that failed to reach it."""
    ranks = {int(h.found.groups["rank"]) for h in hits}
    return _plain(hits, m, tuple(sorted(ranks)) if len(ranks) == 1 else ())


def _connect(hits: list[Hit], m: Messages) -> Finding:
    """A Gloo pair that never connected: when Gloo said it bound the loopback address, that is why."""
    loopback = [h for h in m.hits if h.message.id == "gloo-loopback"]
    return _plain(loopback or hits, m)


def _system(hits: list[Hit], m: Messages) -> Finding:
    """NCCL's system error is its result code; an InfiniBand transfer's failure in the same logs (NCCL's
    "Last error:") is what failed under it."""
    ib = [h for h in m.hits if h.message.id == "nccl-ib-completion"]
    return _plain(ib, m) if ib else _prefixed(hits, m)


def _id_wait(hits: list[Hit], m: Messages) -> Finding:
    """The rank a group's first NCCL collective waited for: a global rank where the store's key names
    the default group (its group ranks are the global ones), else the group's rank, so no culprit."""
    roots = {int(h.found.groups["root"]) for h in hits if "default_pg" in h.line.text}
    return _plain(hits, m, tuple(sorted(roots)) if len(roots) == 1 else ())


def _fatal(hits: list[Hit], m: Messages) -> Finding:
    """c10's fatal signal handler: the signal it names is the cause (std::terminate's is SIGABRT)."""
    named = {h.found.groups.get("signal", "SIGABRT") for h in hits}
    cause = {"SIGSEGV": Cause.SEGFAULT, "SIGBUS": Cause.BUS_ERROR}.get(named.pop(), Cause.ABORT) if len(named) == 1 \
        else Cause.ABORT
    f = _prefixed(hits, m)
    return Finding(f.kind, cause, f.culprits, f.sure, ENDED_FIXES.get(cause), f.message, f.quotes, f.detail)


def _ssh(hits: list[Hit], m: Messages) -> Finding:
    """A node the launcher could not ssh to: the fix names it."""
    named = next((h.found.groups.get("host") or h.found.groups.get("host2") for h in hits), None) or ""
    host = named if HOSTNAME.fullmatch(named) else "HOST"      # a log's words go into a command only as a name
    f = _plain(hits, m)
    return Finding(f.kind, f.cause, (), f.sure, run(f"ssh -o BatchMode=yes {host} hostname", node=None,
                   note="from the launching node: passwordless ssh to every hostfile node (ssh-copy-id), itself too"),
                   f.message, f.quotes, {**f.detail, "nodes": {host: "the launcher could not ssh to it"}})


RULES: dict[str, Callable[[list[Hit], Messages], Finding]] = {
    "cuda-oom": _oom, "address-family": _family, "store-barrier": _barrier, "nccl-system-error": _system,
    "monitored-barrier": _monitored, "gloo-connect": _connect, "nccl-id-wait": _id_wait, "fatal-signal": _fatal,
    "node-ssh-unreachable": _ssh, "nccl-result": _result,
}


def _timeouts(hits: list[Hit]) -> Finding:
    """Collectives that timed out: watchdog.py lines the ranks up per process group."""
    said = by_groups(hits)
    first = hits[0].message
    quotes = _quotes(said.hits or hits)
    timeouts = [int(h.found.groups["timeout"]) for h in hits if "timeout" in h.found.groups]
    if timeouts:
        said.detail["timeout_ms"] = max(timeouts)      # what the run had: never offered as its fix
    if said.mismatch:
        return Finding(FailureKind.MISMATCH, Cause.DIFFERENT_COLLECTIVES, (), Sure.LIKELY, BY_ID["mismatch-report"].fix,
                       first.id, quotes, said.detail)
    if said.behind:
        return Finding(FailureKind.RANK_BEHIND, Cause.BEHIND, said.behind, Sure.LIKELY, first.fix, first.id, quotes,
                       said.detail)
    return Finding(FailureKind.TIMEOUT_UNKNOWN_ROOT, Cause.COLLECT_FLIGHT_RECORDER, (), Sure.UNKNOWN, first.fix,
                   first.id, quotes, said.detail)


STOPS = (-int(signal.SIGTERM), -int(signal.SIGINT), -int(signal.SIGHUP))
SIGNALS = {int(signal.SIGKILL): (FailureKind.SIGNAL_KILLED, Cause.SIGKILL),
           int(signal.SIGSEGV): (FailureKind.CRASHED, Cause.SEGFAULT),
           int(signal.SIGABRT): (FailureKind.CRASHED, Cause.ABORT),
           int(signal.SIGBUS): (FailureKind.CRASHED, Cause.BUS_ERROR)}
# the signals a process's own fault raises (no launcher or person sends them): certain in torchrun's table
CRASHES = tuple(-n for n, (kind, _) in SIGNALS.items() if kind is FailureKind.CRASHED)


# torchrun's table was pasted without its "Root Cause" part: the ranks it lists failed after the first one
ROOT_NOT_PASTED = run("grep -n -A8 'Root Cause (first observed failure)' <the log>",
                      note="torchrun's table names the rank that failed first there; its own error is above the table")


def _ended(exits: list[LauncherExit]) -> Finding | None:
    """How the launchers say the ranks ended: torchrun's first observed failure (its table's root,
    else its line), a signal by its name. A rank that ended in the root's second may have ended first
    (torchrun dates failures to the second): none is named. The table's "Failures:" list without its
    root names no one either. A SIGKILL with no exception of its own: likely the host's OOM killer or
    a scheduler."""
    table = [e for e in exits if e.source == "table"]
    root = next((e for e in table if e.root), None)       # torchrun's first failure, its exit code cut or not
    failed = [e for e in exits if e.code not in (None, 0) or e.source == "spawn" or e is root]
    if root is None and table and all(e.listed for e in table) and all(e.source == "table" for e in failed):
        ranks = sorted({e.rank for e in table if e.rank is not None})
        return Finding(FailureKind.EXITED, Cause.UNKNOWN, (), Sure.UNKNOWN, ROOT_NOT_PASTED, None,
                       tuple(q for e in table for q in e.quotes)[:QUOTES], {"failed_after_the_first": ranks})
    if not failed:
        return None
    table = [e for e in failed if e.source == "table"]
    if root is None and table:
        dated = [e for e in table if e.time]
        root = min(dated, key=lambda e: e.time or "") if dated else table[0]
    if root is None:
        root = failed[0]
    rank = root.rank if root.rank is not None else root.local_rank
    # the ranks torchrun itself stopped after the first failure (SIGTERM, torch 2.13 lists them) are victims
    peers = [e for e in table if e is not root and e.time and (e.code or 0) not in STOPS]
    same_time = root.time is not None and any(e.time == root.time for e in peers)
    # a root whose exit code the paste cut: how the ranks of its second ended is how the first may have
    code = root.code if root.code is not None else next((e.code for e in peers if e.time == root.time), None) or 0
    kind, cause = SIGNALS.get(-code, (FailureKind.EXITED, Cause.UNKNOWN)) if code < 0 else \
        (FailureKind.EXITED, Cause.UNKNOWN)
    if code < 0 and -code not in SIGNALS:
        kind, cause = FailureKind.EXITED, Cause.UNKNOWN
    quotes = tuple(q for q in root.quotes)[:QUOTES]
    detail: dict = {"exitcode": code, "signal": root.signal, "pid": root.pid, "local_rank": root.local_rank}
    if same_time:
        detail["candidates"] = sorted({e.rank for e in (root, *peers) if e.time == root.time and e.rank is not None})
    fix = ENDED_FIXES.get(cause)
    if same_time or rank is None:
        sure = Sure.UNKNOWN if same_time else Sure.LIKELY
        return Finding(kind, cause, (), sure, fix, None, quotes, detail)
    certain = root.source == "table" and root.rank is not None and code in CRASHES
    return Finding(kind, cause, (rank,), Sure.CERTAIN if certain else Sure.LIKELY, fix, None, quotes, detail)
