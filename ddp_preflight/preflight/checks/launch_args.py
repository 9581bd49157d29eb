"""launch-args: torchrun's own parser, on the master's torch, must leave the script's options alone."""

from __future__ import annotations

from collections.abc import Iterator

from ddp_preflight.rules.facts import Missing
from ddp_preflight.rules.launch_args import separate

from ..model import Context, Status, Verdict


def check_launch_args(ctx: Context) -> Iterator[Verdict]:
    args = list(ctx.options.launch_args)
    if not args:
        yield Verdict(Status.SKIP, None, "no training command given (put it after --)")
        return
    if ctx.master.error is not None:
        yield Verdict(Status.SKIP, ctx.master.node, f"not checked: the master was not reached ({ctx.master.error})")
        return
    parse = ctx.master.parsed.launch
    if isinstance(parse, Missing):
        why = parse.reason if parse.failed else "no answer"
        yield Verdict(Status.ERROR, ctx.master.node, f"could not ask torchrun how it parses the command: {why}")
        return
    if not parse.parsed:
        script = next((a for a in args if not a.startswith("-") and a != "-m"), None)
        yield Verdict(Status.FAIL, ctx.master.node,
                      f"torchrun rejects the command: {parse.message} (its own options are abbreviated "
                      "into the script's)", separate(args, script),
                      {"parse": parse.to_json()})
        return
    script = parse.training_script
    after = args[args.index(script) + 1:] if script in args else []
    expected = after[1:] if after[:1] == ["--"] else after
    got = list(parse.training_script_args)
    got = got[1:] if got[:1] == ["--"] else got
    if got != expected:
        swallowed = [a for a in expected if a not in got]
        yield Verdict(Status.FAIL, ctx.master.node,
                      f"torchrun takes {' '.join(swallowed) or 'some options'} for itself: the script never sees them",
                      separate(args, script),
                      {"parse": parse.to_json(), "expected": expected})
        return
    yield Verdict(Status.PASS, ctx.master.node,
                  f"torchrun passes all {len(expected)} script options to {script}", None, {"parse": parse.to_json()})
