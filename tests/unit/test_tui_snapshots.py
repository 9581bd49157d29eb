"""SVG snapshots of the main screen: a healthy run and a deadlock, in a roomy terminal and in
80x24; and every rank's stack grouped (g) on 64 ranks. Review a change with
`pytest tests/unit/test_tui_snapshots.py --snapshot-update` and the report pytest-textual-snapshot
writes on failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddp_preflight.hangwatch.model import Snapshot
from ddp_preflight.tui.app import DashboardApp
from ddp_preflight.tui.replay import ReplaySource

from .wide_snapshots import deadlock_of_64

SNAPSHOTS = Path(__file__).parent / "artifacts" / "snapshots"


@pytest.fixture(autouse=True)
def colour(monkeypatch):
    # The snapshots are the coloured screen, whatever the shell running the tests says.
    monkeypatch.delenv("NO_COLOR", raising=False)


def dashboard(name: str) -> DashboardApp:
    snapshot = Snapshot.from_json(json.loads((SNAPSHOTS / f"{name}.json").read_text()))
    # Ticks would only serve the same snapshot again; an hour keeps them out of the picture.
    return DashboardApp(ReplaySource([snapshot]), refresh=3600)


async def first_snapshot(pilot) -> None:
    for _ in range(500):
        if pilot.app.applied:
            break
        await pilot.pause(0.01)
    await pilot.pause()


def test_healthy_run(snap_compare):
    assert snap_compare(dashboard("healthy"), terminal_size=(120, 36), run_before=first_snapshot)


def test_deadlock(snap_compare):
    assert snap_compare(dashboard("deadlock"), terminal_size=(120, 36), run_before=first_snapshot)


def test_deadlock_in_80x24(snap_compare):
    assert snap_compare(dashboard("deadlock"), terminal_size=(80, 24), run_before=first_snapshot)


def test_every_ranks_stack_grouped_on_64_ranks(snap_compare):
    # g on the recorded deadlock widened to 64 ranks with one odd rank (33): two groups, the odd
    # one marked, and the ranks lined up by their Flight Recorder's numbers above them.
    app = DashboardApp(ReplaySource([deadlock_of_64(odd=33)]), refresh=3600)

    async def press_g(pilot) -> None:
        await first_snapshot(pilot)
        await pilot.press("g")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(120, 36), run_before=press_g)
