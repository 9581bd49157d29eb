"""The dashboard's words and glyphs, without Textual; and the headless layers stay headless."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_preflight.hangwatch.model import Diagnosis, Kind, RankView, Snapshot
from ddp_preflight.hangwatch.render import snapshot_json
from ddp_preflight.tui import format as fmt

SNAPSHOTS = Path(__file__).parent / "artifacts" / "snapshots"
ROOT = Path(__file__).resolve().parents[2]


def test_the_sparkline_shows_the_last_samples_from_idle_to_one_full_core():
    assert fmt.sparkline([0.0, 50.0, 100.0, 250.0], samples=4) == "▁▅██"
    assert fmt.sparkline([100.0] * 30) == "█" * fmt.SPARK_SAMPLES
    # Fewer samples than the width: padded on the left so the newest sample lines up.
    assert fmt.sparkline([0.0, 100.0], samples=4) == "  ▁█"


def test_a_collective_is_named_by_its_op_and_an_idle_rank_by_how_long():
    assert fmt.state_label(RankView("m", 1, state="collective", op="all_reduce")) == "all_reduce"
    assert fmt.state_label(RankView("m", 1, state="idle", idle_for=125.0)) == "idle 2m05s"
    assert fmt.state_label(RankView("m", 1, state="exited", exit="signal 9")) == "exited, signal 9"
    assert fmt.state_label(RankView("m", 1, state="computing")) == "computing"


def test_step_rate_reads_as_steps_per_second_or_seconds_per_step():
    assert fmt.step_text(RankView("m", 1, step=120, step_rate=4.25)) == "120 4.2/s"
    assert fmt.step_text(RankView("m", 1, step=7, step_rate=0.25)) == "7 4.0s/step"
    assert fmt.step_text(RankView("m", 1, step=3, step_rate=0.0)) == "3 stalled"
    assert fmt.step_text(RankView("m", 1)) == ""


def test_since_comes_from_the_snapshots_clock_not_the_wall_clock():
    diagnosis = Diagnosis(Kind.DEADLOCK, "x", since=1000.0)
    assert fmt.since_text(diagnosis, now=1042.0) == "for 42s"
    assert fmt.since_text(diagnosis, now=1000.0 + 3 * 3600 + 60) == "for 3h01m"


def test_preflight_rows_put_failures_first_and_hide_passes_unless_asked():
    results = [{"status": s, "check": c} for s, c in
               (("pass", "a"), ("warn", "b"), ("fail", "c"), ("skip", "d"), ("error", "e"))]
    assert [r["check"] for r in fmt.preflight_rows(results, show_all=False)] == ["c", "e", "b", "d"]
    assert [r["check"] for r in fmt.preflight_rows(results, show_all=True)] == ["c", "e", "b", "d", "a"]
    assert fmt.preflight_counts(results) == "1 fail, 1 error, 1 warn, 1 skip, 1 ok"


def test_the_fixtures_are_snapshots_exactly_as_the_json_contract_gives_them():
    # `hangwatch attach --json`'s form: the snapshot's fields, and its verdict's words rendered from them.
    for name in ("healthy", "deadlock"):
        data = json.loads((SNAPSHOTS / f"{name}.json").read_text())
        assert snapshot_json(Snapshot.from_json(data)) == data, name


def test_the_headless_modules_never_import_textual():
    code = ("import sys, ddp_preflight.hangwatch.model, ddp_preflight.hangwatch.classify, ddp_preflight.hangwatch.diagnose, ddp_preflight.tui.format, ddp_preflight.tui.replay; "  # noqa: E501
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'textual'))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    # The probe can fail: importing the app does pull Textual in.
    done = subprocess.run([sys.executable, "-c", code.replace("ddp_preflight.tui.replay;", "ddp_preflight.tui.replay, ddp_preflight.tui.app;")],  # noqa: E501
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "textual" in done.stdout


def test_a_replay_reads_a_snapshot_a_list_or_the_event_lines_of_attach_json(tmp_path):
    from ddp_preflight.tui.replay import ReplaySource

    deadlock = json.loads((SNAPSHOTS / "deadlock.json").read_text())
    healthy = json.loads((SNAPSHOTS / "healthy.json").read_text())
    (tmp_path / "one.json").write_text(json.dumps(deadlock))
    (tmp_path / "list.json").write_text(json.dumps([healthy, deadlock]))
    (tmp_path / "events.jsonl").write_text("\n".join(json.dumps(e) for e in (
        {"event": "watching", "time": 1.0, "text": "watching 4 ranks"},
        {"event": "diagnosis", "time": 2.0, "text": "deadlock", "snapshot": deadlock})) + "\n")
    (tmp_path / "none.jsonl").write_text(json.dumps({"event": "watching", "text": "x"}) + "\n")

    source = ReplaySource.from_files(tmp_path / "one.json", tmp_path / "list.json", tmp_path / "events.jsonl")
    kinds = [source.snapshot().diagnosis for _ in range(5)]
    assert [k.kind if k else None for k in kinds] == ["deadlock", None, "deadlock", "deadlock", "deadlock"]
    with pytest.raises(ValueError, match="holds no snapshot"):
        ReplaySource.from_files(tmp_path / "none.jsonl")
