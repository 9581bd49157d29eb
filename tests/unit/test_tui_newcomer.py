"""The dashboard as a newcomer meets it, driven through the real app (app.run_test, pilot.press)
on recorded snapshots: `?` lists the keys, a rank that stopped says so in its step column and in
the panel's title before any verdict, and preflight's words stay out of the verdict's sentence."""

from __future__ import annotations

import copy

from ddp_preflight.hangwatch.model import NodeNote, RankStatus
from ddp_preflight.tui.app import DashboardApp
from ddp_preflight.tui.replay import ReplaySource
from ddp_preflight.tui.screens import KeysScreen

from .test_tui_app import recorded, run, screen_text, shown


def screen(snapshot, size=(80, 24), keys: tuple[str, ...] = ()) -> tuple[str, type]:
    """What the terminal shows after the keys, and the screen on top then."""
    async def scenario():
        app = DashboardApp(ReplaySource([snapshot]), refresh=60)
        async with app.run_test(size=size) as pilot:
            await shown(app, pilot)
            for key in keys:
                await pilot.press(key)
                await pilot.pause()
            return screen_text(app), type(app.screen)
    return run(scenario())


def test_question_mark_lists_every_key_and_esc_closes_it():
    text, top = screen(recorded("deadlock"), keys=("question_mark",))

    assert top is KeysScreen
    for key, what in DashboardApp.KEYS:
        assert f"{key}  {what}" in text
    assert screen(recorded("deadlock"), keys=("question_mark", "escape"))[1] is not KeysScreen
    assert "? keys" in screen(recorded("deadlock"))[0]          # the footer says where the list is, at 80x24


def test_the_keys_listed_are_the_dashboards_bindings():
    assert {key for key, _ in DashboardApp.KEYS} == \
        {b.key_display or b.key for b in DashboardApp.BINDINGS}


def test_a_rank_without_progress_for_the_threshold_says_stalled_not_its_last_rate():
    snapshot = copy.deepcopy(recorded("healthy"))
    rank = snapshot.ranks[1]
    rank.state, rank.idle_for, rank.cpu = RankStatus.IDLE, snapshot.threshold + 2, 0.0

    text, _ = screen(snapshot, size=(120, 36))

    rows = {line.split()[0]: line for line in text.splitlines() if line.strip()[:1].isdigit()}
    assert f"{rank.step} stalled" in rows[str(rank.rank)]
    assert "stalled" not in rows["0"] and "4.2/s" in rows["0"]


def test_before_a_verdict_the_title_says_which_rank_stopped_not_no_hang():
    snapshot = copy.deepcopy(recorded("healthy"))
    rank = snapshot.ranks[3]
    rank.state, rank.idle_for, rank.cpu = RankStatus.IDLE, 5.0, 0.0

    text, _ = screen(snapshot, size=(120, 36))

    assert f"no verdict yet · rank {rank.rank} without progress for 5s (a verdict at 8s)" in text
    assert "no hang" not in text
    assert "─ no hang ─" in screen(recorded("healthy"), size=(120, 36))[0]


def test_preflights_notes_come_after_the_cause_not_in_the_verdicts_sentence():
    snapshot = copy.deepcopy(recorded("deadlock"))
    snapshot.diagnosis = type(snapshot.diagnosis)(**{**snapshot.diagnosis.__dict__, "notes": (
        NodeNote("master", "data-shards: 4 shards here, 8 on worker1 (one differs)"),)})

    text, _ = screen(snapshot, size=(120, 36))

    lines = [line.strip("│ ").rstrip(" │") for line in text.splitlines()]
    verdict = next(n for n, line in enumerate(lines) if line.startswith("rank 1 left the loop"))
    assert "preflight said of" not in lines[verdict]
    likely = next(n for n, line in enumerate(lines) if line.startswith("likely:"))
    said = next(n for n, line in enumerate(lines) if line.startswith("preflight said: master: data-shards: 4 shards"))
    assert verdict < likely < said


def test_g_follows_the_run_while_it_is_open():
    from textual.widgets import Static

    from ddp_preflight.tui.screens import StacksScreen

    from .test_tui_app import shown as shown_snapshots
    before = copy.deepcopy(recorded("deadlock"))
    for rank in before.ranks:
        rank.stack = None                                # no stack taken yet when g is pressed
    after = recorded("deadlock")

    async def scenario():
        app = DashboardApp(ReplaySource([before, after]), refresh=60)
        async with app.run_test(size=(120, 36)) as pilot:
            await shown_snapshots(app, pilot)
            await pilot.press("g")
            first = str(app.screen.query_one("#stacks", Static).render())
            app.pull()                                   # the next refresh, with the screen open
            await shown_snapshots(app, pilot, 2)
            assert isinstance(app.screen, StacksScreen)
            return first, str(app.screen.query_one("#stacks", Static).render())
    first, later = run(scenario())

    assert "no stack yet" in first
    assert "no stack yet" not in later and "! rank 1 (1 rank): differs" in later


def test_another_jobs_rank_on_a_node_is_not_a_row_of_the_launched_run():
    from types import SimpleNamespace

    from ddp_preflight.hangwatch.launched import LaunchedRun
    from ddp_preflight.hangwatch.model import RankView
    from ddp_preflight.launch.outcome import LaunchedRank

    seen = copy.deepcopy(recorded("deadlock"))
    ours = [(r.rank, r.node, r.pid) for r in seen.ranks]
    # Another torchrun's rank 0 on master: RANK=0 in its environment, as the agent finds ranks.
    seen.ranks.append(RankView(node="master", pid=424242, rank=0, local_rank=0, world_size=2))
    watcher = SimpleNamespace(snapshot=lambda: copy.deepcopy(seen))
    # The launcher as launch.run.Launch is to LaunchedRun (duck-typed there): its ranks and plan.
    launch = SimpleNamespace(
        ranks={rank: LaunchedRank(rank, node, rank % 2, pid=pid) for rank, node, pid in ours},
        plan=SimpleNamespace(backend="gloo", master_addr="10.213.0.200", master_port=29500, nodes=[],
                             uniform_nproc=2, ranks_per_node={"master": 2, "worker1": 2}, world_size=4))

    snapshot = LaunchedRun(watcher, launch).snapshot()

    assert sorted((r.rank, r.node, r.pid) for r in snapshot.ranks) == sorted(ours)
    text, _ = screen(snapshot, size=(120, 36))
    assert "424242" not in text
