"""launch-args: torchrun's own parser, on the master's torch, must leave the script's options alone."""

from __future__ import annotations

import shlex
from collections.abc import Iterator

from ..model import Context, Result, Status


def _with_separator(args: list[str], script: str | None) -> list[str]:
    """The same command with `--` between the script and its options."""
    if script in args:
        at = args.index(script) + 1
        if args[at:at + 1] != ["--"]:
            return args[:at] + ["--"] + args[at:]
    return args


def check_launch_args(ctx: Context) -> Iterator[Result]:
    ID = "launch-args"
    args = list(ctx.options.launch_args)
    if not args:
        yield Result(ID, Status.SKIP, None, "no training command given (put it after --)")
        return
    if ctx.master.error is not None:
        yield Result(ID, Status.SKIP, ctx.master.node, f"not checked: the master was not reached ({ctx.master.error})")
        return
    parse = ctx.master.facts.get("launch")
    if not parse or "error" in parse:
        yield Result(ID, Status.ERROR, ctx.master.node,
                     f"could not ask torchrun how it parses the command: {(parse or {}).get('error', 'no answer')}")
        return
    if not parse["parsed"]:
        script = next((a for a in args if not a.startswith("-") and a != "-m"), None)
        fixed = shlex.join(["torchrun", "...", *_with_separator(args, script)])
        yield Result(ID, Status.FAIL, ctx.master.node,
                     f"torchrun rejects the command: {parse['message']} (its own options are abbreviated "
                     "into the script's, seed 000)", f"put the script's options after --: {fixed}",
                     {"parse": dict(parse)})
        return
    script = parse["training_script"]
    after = args[args.index(script) + 1:] if script in args else []
    expected = after[1:] if after[:1] == ["--"] else after
    got = parse["training_script_args"]
    got = got[1:] if got[:1] == ["--"] else got
    if got != expected:
        swallowed = [a for a in expected if a not in got]
        yield Result(ID, Status.FAIL, ctx.master.node,
                     f"torchrun takes {' '.join(swallowed) or 'some options'} for itself: the script never sees them (seed 000)",
                     f"put the script's options after --: {shlex.join(['torchrun', '...', *_with_separator(args, script)])}",
                     {"parse": dict(parse), "expected": expected})
        return
    yield Result(ID, Status.PASS, ctx.master.node,
                 f"torchrun passes all {len(expected)} script options to {script}", None, {"parse": dict(parse)})
