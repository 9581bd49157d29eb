"""A Finding in words: renders, decides nothing. What each catalogued message means is the
catalogue's (rules/failures.py); a launcher's word on how a rank ended is said here from its fields."""

from __future__ import annotations

from ddp_preflight.rules.failures import BY_ID, Cause, FailureKind, Sure

from .finding import Finding

ENDED = {
    Cause.SIGKILL: "killed by SIGKILL with no exception of its own: likely the host's OOM killer or a scheduler "
                   "(dmesg or the scheduler's log says which)",
    Cause.SEGFAULT: "crashed with SIGSEGV (a segmentation fault in native code)",
    Cause.ABORT: "aborted with SIGABRT (a C++ exception or a failed assert in native code)",
    Cause.BUS_ERROR: "died of SIGBUS (memory behind a mapping could not be backed: most often a full /dev/shm)",
    Cause.PYTHON_EXCEPTION: "raised an exception of its own",
}


LINED_UP = {
    FailureKind.MISMATCH: "at one sequence number of one process group the ranks were in different collectives: "
                          "they issued different collectives (which rank diverged, the lines do not say)",
    FailureKind.RANK_BEHIND: "behind the others in the same process group: it never entered the collective they "
                             "timed out in",
}


def finding_line(f: Finding) -> str:
    """'signal-killed (likely): rank 2: killed by SIGKILL ...'"""
    who = (("rank " if len(f.culprits) == 1 else "ranks ") + ",".join(map(str, f.culprits)) + ": ") if f.culprits \
        else ""
    if f.kind is FailureKind.NODE_NOT_STARTED:
        failed = f.detail.get("nodes") or {}
        return f"{f.kind.value} ({f.sure.value}): the launch did not start the training on " + \
            "; ".join(f"{node}: {error}" for node, error in failed.items()) + f" [{f.cause.value}]"
    if f.kind in LINED_UP and f.message in ("watchdog", "watchdog-status"):
        words = LINED_UP[f.kind]
    elif f.message == "py-spy":
        words = "py-spy dumps: " + "; ".join(_stack(s) for s in f.detail.get("stacks", [])[:8])
    elif f.message is not None and f.message in BY_ID:
        words = BY_ID[f.message].meaning
    elif f.cause in ENDED:
        words = ENDED[f.cause]
    else:
        code = f.detail.get("exitcode")
        words = f"ended with exit code {code}: its own output says why" if code is not None else "ended"
    if not f.culprits and f.sure is Sure.UNKNOWN:
        words += "; the logs do not say which rank was first"
    return f"{f.kind.value} ({f.sure.value}): {who}{words} [{f.cause.value}]"


def _stack(stack: dict) -> str:
    """'rank 1 waits in all_reduce at train.py:88'"""
    who = f"rank {stack['rank']}" if stack["rank"] is not None else \
        f"process {stack['pid']}" if stack["pid"] is not None else "a process"
    what = f"waits in {stack['op']}" if stack["state"] == "collective" else stack["state"]
    return f"{who} {what}" + (f" at {stack['line']}" if stack["line"] else "")
