"""A launch watched by hangwatch, as a library call: the training on every node (run.py), hangwatch
on the same connections, what the launcher learns of how ranks end fed to hangwatch as evidence,
and at the end one verdict on the run in the result (and its result.json).

    result = watched(cluster, plan, "runs/x")       # blocks until every node has ended

or, to interleave a dashboard, Ctrl-C or a quit (the CLI does):

    run = WatchedLaunch(cluster, plan, "runs/x", on_event=print_it)
    run.start(); ...; run.stop("interrupted"); result = run.conclude(run.wait(30))

The run's verdict is hangwatch's: the hang it named while every rank still ran, if progress never
resumed (what followed is its consequence); else who failed first (exits.judge, over the ends on
one clock)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ddp_preflight.hangwatch.events import Event, EventKind
from ddp_preflight.hangwatch.model import Diagnosis, Kind, NodeNote
from ddp_preflight.preflight.model import Report, Status

from .ends import by_launchers
from .outcome import LaunchResult
from .plan import Plan
from .run import Launch

if TYPE_CHECKING:
    from .in_ranks import Gate

STOP_WAIT = 30.0      # seconds for every node to confirm a stop (the freeze, up to 8 s; the supervisors' grace, 5 s)


class RunVerdict:
    """What hangwatch said of a run, kept for its end: the hang it named, while progress has not
    resumed. `of(result, ended)` is the run's verdict: that hang, when it was named before any rank
    ended (the ends are its consequence); else who failed first (`ended`: exits.judge on the ends,
    as the watcher saw them), else the hang; None for a run that finished."""

    def __init__(self) -> None:
        self.named: Diagnosis | None = None

    def heard(self, event: Event) -> None:
        if event.hang:
            self.named = event.verdict
        elif event.kind is EventKind.RESUMED:
            self.named = None

    def of(self, result: LaunchResult, ended: Diagnosis | None) -> Diagnosis | None:
        if result.ok:
            return None
        if self.named is not None and self.named.kind is not Kind.EXITED:
            # A hang named while every rank still ran: the ends after it (victims' timeouts, torchrun's
            # stop, ddp-preflight's) are its consequence, never the run's verdict.
            return self.named
        return ended if ended is not None else self.named


class WatchedLaunch:
    """`start()` returns at once; `stop(reason)` from anywhere; `wait(timeout)` for the result;
    `conclude(result)` once, at the end: hangwatch settles the order the ranks left in, is closed,
    and its verdict goes into the result. `launch` and `watcher` are there to be read (the
    dashboard shows both)."""

    def __init__(self, cluster, plan: Plan, log_dir: str | Path, *, lease: float | None = None,
                 stop_on_hang: bool = False, endless_after: float | None = None,
                 notes: dict[str, tuple[NodeNote, ...]] | None = None, on_event: Callable[[Event], None] | None = None,
                 gate: Gate | None = None):
        """`gate`: the launch already started, its ranks waiting for the word (in_ranks.py): start()
        gives it, and hangwatch follows the ranks from then on, never the probes or the wait."""
        from ddp_preflight.hangwatch.watch import Watcher, WatchTarget

        self.gate, self.log_dir = gate, log_dir
        self.launch = gate.launch if gate is not None else \
            Launch(cluster, plan, log_dir) if not lease else Launch(cluster, plan, log_dir, lease=lease)
        self.stop_on_hang = stop_on_hang
        self.on_event = on_event
        self.said = RunVerdict()
        # Its own processes alone, told by the run token it starts them with: another run on a node,
        # of the same user too, is never read, stopped or reported (node/ranks.py).
        targets = [WatchTarget(cluster.nodes[i], run=self.launch.run_token) for i in cluster.usable()]
        # The agents go with the run: a node cut off from this machine ends both within one lease.
        self.watcher = Watcher(targets, on_event=self._event, on_hang=self._hang,
                               incident_dir=str(Path(log_dir) / "incidents"), lease=self.launch.lease,
                               endless_after=endless_after, notes=notes,
                               planned={r.rank: r.node for r in self.launch.ranks.values()})
        self.launch.on_stopping.append(self.watcher.launcher_stopping)
        self.launch.on_exception.append(self.watcher.rank_error)
        self.launch.on_rank_end.append(self.watcher.rank_ended)
        self.launch.on_line.append(self._stepped)
        self._steps: dict[int, int] = {}

    def start(self) -> WatchedLaunch:
        if self.gate is not None:
            self.gate.open(self.log_dir)
        else:
            self.launch.start()
        self.watcher.start()
        return self

    def stop(self, reason: str) -> None:
        self.launch.stop(reason)

    def wait(self, timeout: float | None = None) -> LaunchResult | None:
        return self.launch.wait(timeout)

    def conclude(self, result: LaunchResult | None) -> LaunchResult | None:
        """The end of the run (`result` None: a node never confirmed its stop): hangwatch judges the
        order the ranks left in and is closed; its verdict replaces the launcher's own."""
        try:
            if result is not None and not result.ok:
                self.watcher.settle()
            elif result is not None:
                # Every rank exited 0: a run whose ranks never joined a process group still failed
                # (each trained alone), however short: no connection seen (the rule attach ends by,
                # runs.never_connected) and, by each rank's own record, not one collective run.
                alone = self.watcher.ran_no_collective()
                if result.ranks and {r.rank for r in result.ranks} <= set(alone):
                    result.alone = tuple(sorted(r.rank for r in result.ranks))
                    self.launch.add_verdict(self.watcher.alone_verdict())
        finally:
            self.watcher.close()
        if result is not None and not result.alone:
            self.launch.add_verdict(self.verdict(result))
        return result

    def verdict(self, result: LaunchResult) -> Diagnosis | None:
        """The run's verdict: who failed first, else the hang named that stopped it (or that was
        still named when it ended); None when it finished, or nothing failed and no hang stood."""
        if result.ok:
            return None
        # hangwatch's, from the ranks it followed; where it followed none (no rank started), what the
        # torchruns' own lines named (the same rule, launch/ends.py)
        return self.said.of(result, self.watcher.verdict() or by_launchers(result.nodes))

    def _event(self, event: Event) -> None:
        self.said.heard(event)
        if event.verdict is not None and event.verdict.kind is Kind.ALONE:
            # The summary repeats that the ranks never connected: the run may say "training finished".
            self.launch.note("alone", f"hangwatch: {event.text}")
        elif event.connected:
            self.launch.note("alone", None)             # they connected after all
        if self.on_event is not None:
            self.on_event(event)

    def _stepped(self, line) -> None:
        """A rank's new step line is progress for hangwatch (its step may be mostly waiting)."""
        step = line.step
        if line.rank is None or step is None or self._steps.get(line.rank) == step:
            return
        self._steps[line.rank] = step
        self.watcher.rank_stepped(line.node, line.rank, step)

    def _hang(self, bundle: str, certain: bool) -> None:
        """A hang's bundle is written: --stop-on-hang stops the run on a certain one only (a likely
        one may end by itself: docs/hangwatch.md)."""
        if self.stop_on_hang and certain:
            self.launch.stop(f"hangwatch named a hang (--stop-on-hang); bundle {bundle}")


def watched(cluster, plan: Plan, log_dir: str | Path, *, stop_wait: float = STOP_WAIT, **options) -> \
        LaunchResult | None:
    """Run the plan to its end, watched; the result with the run's verdict (None: a node never
    confirmed its stop within `stop_wait` s after the run was stopped). KeyboardInterrupt stops
    every node, then goes on waiting for them."""
    run = WatchedLaunch(cluster, plan, log_dir, **options).start()
    try:
        while run.wait(0.25) is None:
            pass
    except KeyboardInterrupt:
        run.stop("interrupted")
    deadline = time.monotonic() + stop_wait
    result = None
    while result is None and time.monotonic() < deadline:
        result = run.wait(0.25)
    return run.conclude(result)


def preflight_notes(report: Report) -> dict[str, tuple[NodeNote, ...]]:
    """What preflight found wrong on each node, for hangwatch to quote beside a hang there (a
    loader that never ends, on the node with the fewer shards)."""
    notes: dict[str, list[NodeNote]] = {}
    for r in report.results:
        if r.node and r.status in (Status.WARN, Status.FAIL):
            notes.setdefault(r.node, []).append(NodeNote(r.node, r.summary, r.check))
    return {node: tuple(said) for node, said in notes.items()}
