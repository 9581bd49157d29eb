"""The text report: a table of check, node, status and summary, then the fixes.

Fixes are printed below the table, one per line and never wrapped, so they can be pasted.
A summary or a fix may quote what a node holds (a file name, another user's process's command
line): each cell is plain text (never rich markup: "[/x]" is shown, not parsed) and its control
characters are written out (node/terminal.py), never sent to the terminal."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ddp_preflight.node.terminal import shown

from ..model import FixSaid, Report, Status

# Passes worth a line even when passes are hidden: which nodes were reached, and the GPUs and
# topology each node's ranks will use.
ALWAYS_SHOWN = ("node-reachable", "gpu-visible")
STYLE = {Status.PASS: "green", Status.WARN: "yellow", Status.FAIL: "bold red",
         Status.ERROR: "bold magenta", Status.SKIP: "dim"}


def render(report: Report, *, width: int = 120, color: bool = True, verbose: bool = False,
           quiet: bool = False) -> str:
    """`quiet`: the nodes not reached, the fixes and the verdict line only, no table."""
    table = Table(show_lines=False, expand=False, pad_edge=False)
    table.add_column("check", no_wrap=True)
    table.add_column("node", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("#", no_wrap=True, justify="right")
    table.add_column("summary", overflow="fold")
    # Each fix once (one Fix value, however many checks found its cause), numbered in the order
    # the table first shows it; every row that offers it carries its number.
    fixes = report.fixes
    number = {id(r): n for n, said in enumerate(fixes, 1) for r in said.results}
    # A check that does not apply to this run at all (no node of its own: a GPU check on a CPU run,
    # Slurm's outside a job) is one name on one line, unless -v.
    not_for_this_run = [r.check for r in report.results
                        if not verbose and r.status is Status.SKIP and r.node is None]
    for r in report.results:
        if not verbose and r.status == Status.PASS and r.check not in ALWAYS_SHOWN:
            continue
        if not verbose and r.status is Status.SKIP and r.node is None:
            continue
        mark = str(number.get(id(r), ""))
        table.add_row(Text(shown(r.check)), Text(shown(r.node or "-")), Text(r.status.value, style=STYLE[r.status]),
                      mark, Text(shown(r.summary)))
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=color, no_color=not color,
                      color_system="standard" if color else None, highlight=False)
    # A node that gave no facts decides every row below it: said first, in one line each.
    for r in report.results:
        if r.check == "node-reachable" and r.status in (Status.FAIL, Status.ERROR):
            fix = f" (fix {number[id(r)]} below)" if id(r) in number else ""
            console.print(Text.assemble(("NOT CHECKED: ", STYLE[r.status]), shown(r.summary) + fix), soft_wrap=True)
    if not quiet:
        console.print(table)
        if not_for_this_run:
            console.print(Text(f"skipped, not part of this run: {', '.join(not_for_this_run)} (-v shows why)",
                               style="dim"))
    if fixes:
        console.print(Text("fixes:", style="bold"))
        for n, said in enumerate(fixes, 1):
            console.print(Text.assemble(f"{n:>3}. ", (shown(_with_checks(said)), "cyan")), soft_wrap=True)
    counts = {s: sum(1 for r in report.results if r.status == s) for s in Status}
    verdict = Text("OK" if report.ok else "NOT READY", style="bold green" if report.ok else "bold red")
    line = Text.assemble(verdict, f": {counts[Status.PASS]} passed, {counts[Status.WARN]} warnings, "
                                  f"{counts[Status.FAIL]} failed, {counts[Status.ERROR]} errors, "
                                  f"{counts[Status.SKIP]} skipped on {len(report.nodes)} node(s)")
    if not verbose and not quiet and counts[Status.PASS]:
        line.append("  (passes hidden: -v shows them)", style="dim")
    console.print(line)
    return out.getvalue()


def _with_checks(said: FixSaid) -> str:
    """The fix's line; when several checks found its cause, they are named after it as a shell
    comment (in the fix's own note where it has one), so the line still pastes as it is."""
    checks = said.checks
    if len(checks) < 2 or said.remedy is None:
        return said.text
    seen = f"seen by {', '.join(checks)}"
    remedy = said.remedy
    return remedy.with_note(f"{remedy.note}; {seen}" if remedy.note else seen).text()
