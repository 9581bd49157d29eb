"""Exit codes, one set for every command (a CI job gates training on them)."""

import enum


class Exit(enum.IntEnum):
    OK = 0             # no failure: ready; no hang named; every rank exited 0
    FOUND = 1          # a check failed (or warned, with --strict); a hang was named; a rank failed
                       # or the run was stopped; preflight refused the launch
    USAGE = 2          # usage or internal error (one line on stderr, never a traceback)
    INTERRUPTED = 130  # Ctrl-C before anything could be said


def internal_error(prog: str, exc: Exception) -> int:
    """A bug: one line and exit 2, never a traceback that looks like a finding
    (DDP_PREFLIGHT_DEBUG=1 raises it again, from the caller's except block)."""
    import os
    import sys

    from ddp_preflight.node.terminal import shown  # an error may quote a node's words: shown, never obeyed

    print(f"{prog}: internal error: {type(exc).__name__}: {shown(str(exc))} (please report it; "
          "DDP_PREFLIGHT_DEBUG=1 shows the traceback)", file=sys.stderr)
    if os.environ.get("DDP_PREFLIGHT_DEBUG"):
        raise exc
    return Exit.USAGE


def reader_gone() -> int:
    """stdout's reader went away (`ddp-preflight --json | head`): nothing more to say and no error
    about it; the exit a shell gives a command that SIGPIPE ended. stdout goes to /dev/null so that
    the interpreter's own last flush does not fail again."""
    import os
    import sys

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError:
        pass
    return 141
