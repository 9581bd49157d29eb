"""`ddp-preflight explain PATH ...`: name the cause of a failed or stuck run from what it left."""

from __future__ import annotations

import argparse
import sys

from . import examples
from .args import Parser
from .exit import Exit, internal_error, reader_gone


def _parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="ddp-preflight explain",
        description="Name the cause of a failed or stuck run from what it left: a launch's log folder, torchrun "
                    "output, torchelastic error files, Flight Recorder dumps, incident bundles, a Slurm job's output.",
        epilog=examples.EXPLAIN)
    p.add_argument("paths", nargs="+", metavar="PATH", help="files or folders; - reads stdin")
    p.add_argument("--json", action="store_true", help="print the explanation as one JSON object")
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        return _explain(args)
    except BrokenPipeError:
        return reader_gone()
    except KeyboardInterrupt:
        # Ctrl-C while a big file or stdin is read: one line, nothing half-printed after it.
        print("ddp-preflight explain: interrupted (Ctrl-C) before the explanation: nothing was said",
              file=sys.stderr)
        return Exit.INTERRUPTED


def _explain(args: argparse.Namespace) -> int:
    from ddp_preflight.explain import explain
    from ddp_preflight.explain.inputs import InputError
    from ddp_preflight.explain.render import as_json, as_text
    from ddp_preflight.node.terminal import shown
    stdin = None
    if "-" in args.paths:
        # Bounded in size and time (an endless pipe, a terminal left open): what is read says so.
        import io

        from ddp_preflight.explain.inputs import BoundedStdin
        stdin = BoundedStdin()
        sys.stdin = io.TextIOWrapper(io.BufferedReader(stdin, 1 << 20))
    try:
        explanation = explain(args.paths)
        note = stdin.note() if stdin is not None else None
        if note is not None:
            from dataclasses import replace
            explanation = replace(explanation, skipped=(*explanation.skipped, note))
    except InputError as exc:
        # It may quote the input (a file's name, a line of it): shown, never obeyed.
        print(f"ddp-preflight explain: error: {shown(str(exc))}", file=sys.stderr)
        return Exit.USAGE
    except Exception as exc:   # a bug: one line and exit 2, never a traceback that looks like a finding
        return internal_error("ddp-preflight explain", exc)
    if not explanation.read and stdin is None:
        # Folders with no file that is a log (empty, or binaries only): nothing was explained, so no
        # "no failure found"; unreadable input, as a binary file named alone is.
        why = f" ({len(explanation.skipped)} not read: {shown(explanation.skipped[0])}" + \
              (", ...)" if len(explanation.skipped) > 1 else ")") if explanation.skipped else ""
        print(f"ddp-preflight explain: error: nothing to read in {shown(', '.join(args.paths))}{why}: give a run's "
              "log folder, a log file, an error file, a Flight Recorder dump or an incident bundle", file=sys.stderr)
        return Exit.USAGE
    sys.stdout.write(as_json(explanation) + "\n" if args.json else as_text(explanation))
    return Exit.OK if explanation.ok else Exit.FOUND
