"""The training command as torchrun must get it: the script's options after `--`, so torchrun's
parser cannot take them for its own abbreviated options (launch-args; `ddp-preflight explain` on
torchrun's usage error)."""

from __future__ import annotations

import shlex

from .fix import Fix, change


def with_separator(args: list[str], script: str | None) -> list[str]:
    """The same command with `--` between the script and its options."""
    if script in args:
        at = args.index(script) + 1
        if args[at:at + 1] != ["--"]:
            return args[:at] + ["--"] + args[at:]
    return args


def separate(args: list[str], script: str | None) -> Fix:
    """The fix when torchrun reads the script's options."""
    return change(f"put the script's options after --: {shlex.join(['torchrun', '...', *with_separator(args, script)])}")
