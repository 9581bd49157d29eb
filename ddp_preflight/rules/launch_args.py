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


# Ranks one CPU can hold: past this they only take turns (the lab runs 8 ranks per node on 2 CPUs
# to try 16-rank collectives; ranks-per-node says how many run well, and --force overrides it).
RANKS_PER_CPU = 16


def too_many_ranks(nproc_per_node: int, cpus: dict[str, int | None]) -> str | None:
    """Why `nproc_per_node` ranks are more than a node can hold, or None: each rank is a process
    that computes, and a node holds at most RANKS_PER_CPU per CPU it may use (`cpus`: NODE -> the
    CPUs its affinity allows, None where its facts do not say). Said of the node with the fewest;
    --force does not override it (100,000 workers on a 2-core box is no launch)."""
    known = {node: n for node, n in cpus.items() if n}
    over = {node: n for node, n in known.items() if nproc_per_node > n * RANKS_PER_CPU}
    if not over:
        return None
    node = min(over, key=lambda name: over[name])
    most = min(known.values()) * RANKS_PER_CPU
    return (f"--nproc-per-node {nproc_per_node} is more ranks than {node} can hold ({over[node]} CPUs it may use, "
            f"at most {RANKS_PER_CPU} ranks each): give --nproc-per-node {most} or fewer (ranks-per-node says how "
            "many run well); --force does not override this")
