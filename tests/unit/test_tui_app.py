"""The dashboard driven through its keys with Textual's pilot, on recorded snapshots."""

from __future__ import annotations

import asyncio
import copy
import io
import json
import re
import time
from pathlib import Path

from rich.console import Console
from textual.widgets import DataTable, Static

from ddp_preflight.hangwatch.model import Snapshot
from ddp_preflight.tui.app import DashboardApp
from ddp_preflight.tui.replay import ReplaySource, widen
from ddp_preflight.tui.screens import LogScreen, QuitScreen, StackScreen, StacksScreen
from ddp_preflight.tui.widgets import PreflightPanel, RanksTable

SNAPSHOTS = Path(__file__).parent / "artifacts" / "snapshots"
BUNDLE = "/var/tmp/hangwatch/incident-20251121-101700-manual"


def recorded(name: str) -> Snapshot:
    return Snapshot.from_json(json.loads((SNAPSHOTS / f"{name}.json").read_text()))


class BundleSource(ReplaySource):
    def write_bundle(self) -> str | None:
        super().write_bundle()
        return BUNDLE


class BrokenSource(ReplaySource):
    def snapshot(self) -> Snapshot:
        raise ConnectionError("the watcher's SSH session to worker1 closed")


class StreamingSource(ReplaySource):
    """A new snapshot on every call: every rank's CPU moves, as in a live run."""

    def __init__(self, snapshot: Snapshot):
        super().__init__([snapshot])
        self.calls = 0

    def snapshot(self) -> Snapshot:
        self.calls += 1
        snap = copy.deepcopy(self.snapshots[0])
        for rank in snap.ranks:
            rank.cpu = float((self.calls * 7 + (rank.rank or 0)) % 100)
            rank.history = rank.history[1:] + [rank.cpu]
        return snap


async def shown(app: DashboardApp, pilot, count: int = 1) -> None:
    """Wait until the app has shown `count` snapshots."""
    for _ in range(500):
        if app.applied >= count:
            await pilot.pause()
            return
        await pilot.pause(0.01)
    raise AssertionError(f"the dashboard showed {app.applied} snapshots, not {count}")


def screen_text(app: DashboardApp) -> str:
    """What a person sees on the terminal, as plain text."""
    console = Console(width=app.size.width, file=io.StringIO(), record=True, color_system=None,
                      legacy_windows=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


def notices(app: DashboardApp) -> list[str]:
    return [n.message for n in app._notifications]


def run(coro):
    return asyncio.run(coro)


# --- bindings ------------------------------------------------------------------------------

def test_s_shows_the_guilty_ranks_full_stack_innermost_first():
    async def scenario():
        app = DashboardApp(ReplaySource([recorded("deadlock")]), refresh=60)
        async with app.run_test(size=(120, 36)) as pilot:
            await shown(app, pilot)
            assert app.query_one(RanksTable).selected().rank == 1      # the diagnosis put the cursor there
            await pilot.press("s")
            assert isinstance(app.screen, StackScreen)
            stack = str(app.screen.query_one("#stack", Static).render())
            assert stack.splitlines() == ["hang.py:11  <module>"]
            await pilot.press("up", "escape")
            assert not isinstance(app.screen, StackScreen)
            await pilot.press("up", "s")                               # rank 0, in all_reduce
            lines = str(app.screen.query_one("#stack", Static).render()).splitlines()
            assert lines[0] == "torch/distributed/distributed_c10d.py:3252  all_reduce"
            assert lines[-2:] == ["hang.py:6  train_step", "hang.py:10  <module>"]
    run(scenario())


def test_s_on_a_rank_without_a_stack_says_to_press_d():
    async def scenario():
        app = DashboardApp(ReplaySource([recorded("healthy")]), refresh=60)
        async with app.run_test(size=(120, 36)) as pilot:
            await shown(app, pilot)
            await pilot.press("down", "down", "down", "s")             # rank 3 has no stack yet
            assert isinstance(app.screen, StackScreen) and app.screen.rank.rank == 3
            assert "no stack yet: press d" in str(app.screen.query_one("#stack", Static).render())
    run(scenario())


def test_g_shows_every_ranks_stack_grouped_the_odd_rank_marked_and_the_ranks_joined():
    from .wide_snapshots import deadlock_of_64

    async def scenario():
        app = DashboardApp(ReplaySource([deadlock_of_64(odd=33)]), refresh=60)
        async with app.run_test(size=(120, 36)) as pilot:
            await shown(app, pilot)
            await pilot.press("g")
            assert isinstance(app.screen, StacksScreen)
            lines = str(app.screen.query_one("#stacks", Static).render()).splitlines()
            await pilot.press("escape")
            assert not isinstance(app.screen, StacksScreen)
            return lines
    assert run(scenario()) == [
        "Flight Recorder: rank 33 never entered all_reduce #12 (its last: #11 all_reduce; it was at hang.py:11), "
        "which ranks 0-32,34-63 issued at hang.py:6",
        "",
        "  ranks 0-32,34-63 (63 ranks)",
        "    torch/distributed/distributed_c10d.py:3252  all_reduce",
        "    torch/distributed/c10d_logger.py:83  _exception_logger.<locals>.wrapper",
        "    hang.py:6  train_step",
        "    hang.py:10  <module>",
        "",
        "! rank 33 (1 rank): differs",
        "    hang.py:11  <module>"]


def test_g_without_a_hang_shows_the_groups_alone_and_ranks_without_a_stack_last():
    async def scenario():
        app = DashboardApp(ReplaySource([recorded("healthy")]), refresh=60)
        async with app.run_test(size=(120, 36)) as pilot:
            await shown(app, pilot)
            await pilot.press("g")
            return str(app.screen.query_one("#stacks", Static).render()).splitlines()
    lines = run(scenario())
    assert lines[0] == "  ranks 0-2 (3 ranks)"
    assert lines[-1] == "  rank 3 (1 rank): no stack yet, press d to take every rank's stack now"
    assert not any(line.startswith(("!", "Flight Recorder")) for line in lines)


def test_d_asks_the_source_for_every_stack_and_says_so():
    async def scenario():
        source = ReplaySource([recorded("deadlock")])
        app = DashboardApp(source, refresh=60)
        async with app.run_test() as pilot:
            await shown(app, pilot)
            await pilot.press("d")
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert source.asked == ["dump_stacks"]
            assert any("taking every rank's stack" in n for n in notices(app))
    run(scenario())


def test_b_writes_a_bundle_and_shows_its_path():
    async def scenario():
        source = BundleSource([recorded("deadlock")])
        app = DashboardApp(source, refresh=60)
        async with app.run_test() as pilot:
            await shown(app, pilot)
            await pilot.press("b")
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert source.asked == ["write_bundle"]
            assert f"bundle written: {BUNDLE}" in notices(app)
    run(scenario())


def test_b_says_when_no_bundle_was_written():
    async def scenario():
        app = DashboardApp(ReplaySource([recorded("deadlock")]), refresh=60)
        async with app.run_test() as pilot:
            await shown(app, pilot)
            await pilot.press("b")
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert any(n.startswith("no bundle written") for n in notices(app))
    run(scenario())


def test_l_shows_the_selected_ranks_log_from_the_source():
    async def scenario():
        logs = {("master", 1): ["step 1 loss 2.3010", "step 2 loss 2.2958", "step 3 loss 2.2906"]}
        source = ReplaySource([recorded("deadlock")], logs=logs)
        app = DashboardApp(source, refresh=60)
        async with app.run_test(size=(120, 36)) as pilot:
            await shown(app, pilot)
            await pilot.press("l")
            assert isinstance(app.screen, LogScreen)
            await app.screen.workers.wait_for_complete()
            await pilot.pause()
            assert "log master 1" in source.asked
            assert str(app.screen.query_one("#log", Static).render()).splitlines() == logs[("master", 1)]
            await pilot.press("escape")
            assert not isinstance(app.screen, LogScreen)
    run(scenario())


def test_a_ranks_escape_sequences_are_shown_in_the_table_and_the_log_not_sent_to_the_terminal():
    async def scenario():
        hostile = "\x1b]0;owned\x07\x1b[2J\x1b[31mred\tafter a tab"
        snapshot = recorded("deadlock")
        for rank in snapshot.ranks:
            rank.last_line = hostile
        source = ReplaySource([snapshot], logs={(r.node, r.rank): ["step 1", hostile] for r in snapshot.ranks})
        app = DashboardApp(source, refresh=60)
        async with app.run_test(size=(160, 36)) as pilot:
            await shown(app, pilot)
            table = app.query_one(RanksTable)
            last_output = [str(cell) for cell in table.get_column("output")]
            assert last_output == ["^[]0;owned^G^[[2J^[[31mred\tafter a tab"] * len(snapshot.ranks)
            await pilot.press("l")
            await app.screen.workers.wait_for_complete()
            await pilot.pause()
            log = str(app.screen.query_one("#log", Static).render())
            assert log.splitlines() == ["step 1", "^[]0;owned^G^[[2J^[[31mred\tafter a tab"]
    run(scenario())


def test_selecting_a_preflight_result_shows_its_fix():
    async def scenario():
        app = DashboardApp(ReplaySource([recorded("healthy")]), refresh=60)
        async with app.run_test(size=(120, 36)) as pilot:
            await shown(app, pilot)
            panel = app.query_one(PreflightPanel)
            detail = app.query_one("#preflight-detail", Static)
            assert "fix: export OMP_NUM_THREADS=1   # on worker1" in str(detail.render())
            await pilot.press("tab")                                   # from the ranks to the checks
            assert app.focused is app.query_one("#preflight-list", DataTable)
            await pilot.press("down")
            assert panel.selected()["check"] == "clock-skew"
            text = str(detail.render())
            assert "worker1's clock is 5.0 s ahead of the master's" in text
            assert "timedatectl set-ntp true" in text
    run(scenario())


def test_a_shows_every_check_or_only_the_problems():
    async def scenario():
        app = DashboardApp(ReplaySource([recorded("healthy")]), refresh=60)
        async with app.run_test(size=(120, 36)) as pilot:
            await shown(app, pilot)
            checks = app.query_one("#preflight-list", DataTable)
            assert checks.row_count == 4                               # 2 warn + 2 skip; 21 passes hidden
            await pilot.press("a")
            assert checks.row_count == 25
            await pilot.press("a")
            assert checks.row_count == 4
    run(scenario())


def test_an_attached_run_has_no_preflight_panel():
    async def scenario():
        snapshot = recorded("deadlock")
        snapshot.preflight, snapshot.run = None, None
        app = DashboardApp(ReplaySource([snapshot]), refresh=60)
        async with app.run_test(size=(120, 36)) as pilot:
            await shown(app, pilot)
            assert not app.query_one(PreflightPanel).display
            assert "attached" in screen_text(app)
    run(scenario())


# --- quitting -------------------------------------------------------------------------------

def quit_with(launched: bool, *keys: str):
    async def scenario():
        source = ReplaySource([recorded("deadlock")], launched=launched)
        app = DashboardApp(source, refresh=60)
        async with app.run_test() as pilot:
            await shown(app, pilot)
            await pilot.press("q")
            await pilot.pause()
            asked = isinstance(app.screen, QuitScreen)
            if asked:
                assert "Stop the training on every node?" in screen_text(app)
            await pilot.press(*keys)
            running = app.is_running and app.return_value is None
        return source, app.return_value, asked, running
    return run(scenario())


def test_quitting_an_attached_run_just_quits_and_stops_nothing():
    source, choice, asked, _ = quit_with(False)
    assert (choice, asked, source.asked) == ("leave", False, [])


def test_quitting_a_launched_run_and_answering_yes_stops_the_training():
    source, choice, asked, _ = quit_with(True, "y")
    assert (choice, asked, source.asked) == ("stop", True, ["stop"])


def test_quitting_a_launched_run_and_answering_no_leaves_it_running():
    source, choice, asked, _ = quit_with(True, "n")
    assert (choice, asked, source.asked) == ("leave", True, [])


def test_escape_at_the_question_keeps_the_dashboard():
    source, choice, asked, running = quit_with(True, "escape")
    assert (choice, asked, running, source.asked) == (None, True, True, [])


# --- updates --------------------------------------------------------------------------------

def test_a_new_snapshot_changes_the_rows_in_place():
    async def scenario():
        app = DashboardApp(ReplaySource([recorded("healthy"), recorded("deadlock")]), refresh=60)
        async with app.run_test(size=(120, 36)) as pilot:
            await shown(app, pilot)
            table = app.query_one(RanksTable)
            rebuilt = []
            table.clear = lambda *a, **k: rebuilt.append(a)           # a rebuild would show here
            keys = [row.key for row in table.ordered_rows]
            assert str(table.get_cell(keys[0], "state")) == "computing"
            app.pull()
            await shown(app, pilot, 2)
            assert [row.key for row in table.ordered_rows] == keys and rebuilt == []
            assert str(table.get_cell(keys[0], "state")) == "all_reduce"
            assert str(table.get_cell(keys[1], "rank")) == "!1"
            assert table.selected().rank == 1
    run(scenario())


def test_ranks_that_appear_get_rows_and_the_cursor_stays_on_its_rank():
    async def scenario():
        small = recorded("healthy")
        wide = widen(small, 4, 2)
        for recorded_rank, rank in zip(small.ranks, wide.ranks, strict=False):      # the same 4 processes, 4 more
            rank.pid = recorded_rank.pid
        app = DashboardApp(ReplaySource([small, wide]), refresh=60)
        async with app.run_test(size=(120, 36)) as pilot:
            await shown(app, pilot)
            table = app.query_one(RanksTable)
            await pilot.press("down")
            assert table.row_count == 4 and table.selected().rank == 1
            app.pull()
            await shown(app, pilot, 2)
            assert table.row_count == 8 and table.selected().rank == 1
    run(scenario())


def test_a_source_that_fails_is_said_once_and_the_dashboard_stays():
    async def scenario():
        app = DashboardApp(BrokenSource([recorded("healthy")]), refresh=0.05)
        async with app.run_test() as pilot:
            await pilot.pause(0.3)
            said = [n for n in notices(app) if n.startswith("could not read the run")]
            assert said == ["could not read the run: ConnectionError: the watcher's SSH session to worker1 closed"]
            assert app.is_running
    run(scenario())


def test_64_ranks_load_and_a_key_is_answered_quickly_while_snapshots_stream():
    async def scenario():
        source = StreamingSource(widen(recorded("deadlock"), 8, 8))
        app = DashboardApp(source, refresh=0.1)                        # ten times the default rate
        async with app.run_test(size=(120, 36)) as pilot:
            await shown(app, pilot, 3)
            table = app.query_one(RanksTable)
            assert table.row_count == 64
            guilty = [row.key for row in table.ordered_rows if str(table.get_cell(row.key, "rank")).startswith("!")]
            assert len(guilty) == 16                                   # rank 1 of every 4, as recorded
            before = app.applied
            # Posted like a terminal's key: pilot.press would wait for an idle app, which a
            # stream of snapshots never is.
            started = time.perf_counter()
            app.simulate_key("s")
            while not isinstance(app.screen, StackScreen) and time.perf_counter() - started < 5:
                await asyncio.sleep(0.002)
            took = time.perf_counter() - started
            assert isinstance(app.screen, StackScreen)
            app.simulate_key("escape")
            await shown(app, pilot, before + 5)                        # and the updates kept coming
        return took
    took = run(scenario())
    # A few ms on an idle box; the bound leaves room for a busy shared one.
    assert took < 0.5, f"the key took {took * 1000:.0f} ms"


# --- terminals ------------------------------------------------------------------------------

def test_an_80x24_terminal_shows_the_diagnosis_the_guilty_rank_and_the_keys():
    async def scenario():
        app = DashboardApp(ReplaySource([recorded("deadlock")]), refresh=60)
        async with app.run_test(size=(80, 24)) as pilot:
            await shown(app, pilot)
            return screen_text(app)
    text = run(scenario())
    assert "DEADLOCK · for 42s · look at rank 1" in text
    assert "rank 1 left the loop: idle at hang.py:11" in text
    assert re.search(r"!1 +master +11351 .* idle 42s +hang\.py:11", text)
    assert all(f" {rank} " in text for rank in (0, 2, 3))
    assert "WARN    omp-threads" in text
    assert "s stack" in text and "q quit" in text


def svg_colors(svg: str) -> set[str]:
    # Rich's SVG frame draws three coloured window buttons and has a default foreground; they
    # are not the app's.
    return set(re.findall(r"#[0-9a-fA-F]{6}", svg)) - {"#ff5f57", "#febc2e", "#28c840", "#c5c8c6"}


def screenshot(monkeypatch, no_color: bool) -> tuple[str, str]:
    if no_color:
        monkeypatch.setenv("NO_COLOR", "1")
    else:
        monkeypatch.delenv("NO_COLOR", raising=False)

    async def scenario():
        app = DashboardApp(ReplaySource([recorded("deadlock")]), refresh=60)
        async with app.run_test(size=(80, 24)) as pilot:
            await shown(app, pilot)
            return app.export_screenshot(), screen_text(app)
    return run(scenario())


def test_no_color_gives_a_screen_in_greys_that_still_marks_the_guilty_rank(monkeypatch):
    def grey(color: str) -> bool:
        return color[1:3].lower() == color[3:5].lower() == color[5:7].lower()

    colored, _ = screenshot(monkeypatch, no_color=False)
    assert any(not grey(c) for c in svg_colors(colored))              # the check can tell
    plain, text = screenshot(monkeypatch, no_color=True)
    assert [c for c in svg_colors(plain) if not grey(c)] == []
    assert re.search(r"!1 +master", text) and "! rank 1 on master" in text
