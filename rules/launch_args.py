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


def too_many_ranks(nproc_per_node: int, cpus: dict[str, int | None]) -> str | None:
    """Why `nproc_per_node` ranks are more than a node can run, or None: each rank is a process
    that computes, and a node runs at most one per CPU it may use (`cpus`: NODE -> the CPUs its
    affinity allows, None where its facts do not say). Said of the node with the fewest; --force
    does not override it (100,000 workers on a 2-core box is no launch)."""
    known = {node: n for node, n in cpus.items() if n}
    over = {node: n for node, n in known.items() if nproc_per_node > n}
    if not over:
        return None
    node = min(over, key=lambda name: over[name])
    fewest = min(known.values())
    return (f"--nproc-per-node {nproc_per_node} is more ranks than {node} can run at once ({over[node]} CPUs "
            f"it may use, one rank each): give --nproc-per-node {fewest} or fewer; --force does not override this")
