"""What preflight says on a terminal while it waits, and whether its output is in colour."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time


def color_wanted(args: argparse.Namespace) -> bool:
    """Colors unless --no-color or NO_COLOR (any value, as no-color.org says)."""
    return not args.no_color and "NO_COLOR" not in os.environ


@contextlib.contextmanager
def progress(targets, *, quiet: bool, color: bool):
    """While preflight waits on its nodes (15-90 s): what it is doing and for how long, on stderr
    when it is a terminal (rich's live display, gone when done), and shard hashing's progress in
    it; yields the hashing callback, None when quiet or not on a terminal."""
    if quiet or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from ddp_preflight.node.terminal import shown
    if len(targets) == 1 and targets[0].local:
        doing = f"checking this machine ({shown(targets[0].name)}) alone (no HOST given)"
    else:
        names = shown(", ".join(t.name for t in targets[:4])) + (", ..." if len(targets) > 4 else "")
        doing = f"checking {len(targets)} node(s) ({names}): their facts, then probes across them"
    console = Console(stderr=True, no_color=not color, highlight=False)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                  transient=True) as bar:
        task = bar.add_task(doing, total=None)
        shown_at = {"at": 0.0}

        def hashing(node, p):
            now = time.monotonic()
            if now - shown_at["at"] > 0.25 or p[0] == p[1]:
                shown_at["at"] = now
                bar.update(task, description=f"hashing shards on {shown(node)}: {p[0] / 1e9:.2f}/"
                                             f"{p[1] / 1e9:.2f} GB, {p[2]}/{p[3]} files")
        yield hashing
