"""The dashboard's frame time with 64 ranks (goal: well inside a 100 ms budget, so a refresh a
second leaves the terminal responsive), as a ratio to the budget and to the same run on 8 ranks.

Headless, on the recorded deadlock snapshot widened to 8 nodes x 8 ranks. Every snapshot moves
every rank's CPU, sparkline, step and output line, so each refresh redraws every visible row. A
frame is timed from the snapshot's message reaching the app to the end of the screen's next
redraw; the source's work happens before, in the worker thread, as in a live run."""

from __future__ import annotations

import asyncio
import copy
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ddp_preflight.hangwatch.model import Snapshot  # noqa: E402
from ddp_preflight.tui.app import DashboardApp  # noqa: E402
from ddp_preflight.tui.replay import ReplaySource, widen  # noqa: E402

RECORDED = ROOT / "tests" / "unit" / "artifacts" / "snapshots" / "deadlock.json"
UPDATES = 50
ROUNDS = 3
BUDGET_MS = 100.0
SIZE = (120, 36)


def moving(base: Snapshot, count: int) -> list[Snapshot]:
    """`count` snapshots of the same run in which every rank's figures change each time."""
    snapshots = []
    for tick in range(count):
        snap = copy.deepcopy(base)
        snap.time += tick
        for rank in snap.ranks:
            rank.cpu = float((tick * 37 + rank.rank * 11) % 101)
            rank.history = (rank.history + [rank.cpu])[-60:]
            rank.step = (rank.step or 0) + tick
            rank.last_line = f"step {rank.step} loss {2.3 - tick * 0.001:.4f}"
        snapshots.append(snap)
    return snapshots


class TimedDashboard(DashboardApp):
    """Stamps when a snapshot's message arrives and when the screen has been redrawn after it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.arrived = self.redrawn = 0.0
        self.work = 0.0           # seconds of the UI thread spent applying and redrawing

    def on_snapshot_taken(self, message) -> None:
        self.arrived = time.perf_counter()
        super().on_snapshot_taken(message)
        self.work = time.perf_counter() - self.arrived

    def watch_redraws(self) -> None:
        # The screen's compositor refresh is where Textual draws the changed regions; a private
        # hook, used only here to see the end of the frame.
        screen = self.screen
        redraw = screen._compositor_refresh

        def timed_redraw():
            started = time.perf_counter()
            redraw()
            self.redrawn = time.perf_counter()
            self.work += self.redrawn - started
        screen._compositor_refresh = timed_redraw


async def frame_times(nodes: int, ranks_per_node: int) -> tuple[list[float], list[float]]:  # in ms
    base = widen(Snapshot.from_json(json.loads(RECORDED.read_text())), nodes, ranks_per_node)
    app = TimedDashboard(ReplaySource(moving(base, UPDATES + 1)), refresh=3600)   # we pull, not the timer
    times, work = [], []
    async with app.run_test(size=SIZE) as pilot:
        while not app.applied:
            await asyncio.sleep(0.005)
        await pilot.pause(0.1)
        app.watch_redraws()
        for _ in range(UPDATES):
            shown = app.applied
            app.redrawn = 0.0
            app.pull()
            while app.applied == shown or app.redrawn < app.arrived:
                await asyncio.sleep(0.001)
            times.append((app.redrawn - app.arrived) * 1000)
            work.append(app.work * 1000)
    return times, work


def main() -> int:
    # Rounds alternate the two sizes, so a burst of other work on a shared box lands on both.
    wide, wide_work, small, small_work = [], [], [], []
    for _ in range(ROUNDS):
        times, work = asyncio.run(frame_times(8, 8))
        wide += times
        wide_work += work
        times, work = asyncio.run(frame_times(2, 4))
        small += times
        small_work += work
    med, worst, med_small = statistics.median(wide), max(wide), statistics.median(small)
    print(f"64 ranks: median {med:.1f} ms, max {worst:.1f} ms per refresh ({ROUNDS}x{UPDATES} refreshes, {SIZE[0]}x{SIZE[1]}) "
          f"= {med / BUDGET_MS:.2f}x of the {BUDGET_MS:.0f} ms budget; {med / med_small:.1f}x of 8 ranks "
          f"(median {med_small:.1f} ms) {'OK' if med < BUDGET_MS else 'OVER BUDGET'}")
    # The frame includes waiting for Textual's next screen update (it redraws at most 60 times a
    # second); the UI thread's own work is the part that grows with the ranks.
    work, work_small = statistics.median(wide_work), statistics.median(small_work)
    print(f"  of which UI-thread work (apply the snapshot + redraw): median {work:.1f} ms, max {max(wide_work):.1f} ms "
          f"= {work / BUDGET_MS:.2f}x of the budget; {work / work_small:.1f}x of 8 ranks (median {work_small:.1f} ms)")
    # The verdict is on the median: the max on a shared box is mostly other processes' time.
    return 0 if med < BUDGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
