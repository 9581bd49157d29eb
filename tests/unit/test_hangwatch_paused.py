"""A slow rank that pauses each step longer than the threshold (a straggler asleep 10 s or 20 s a
step) is one straggler notice with its step time, not a held notice at each step (issue 35). The
evidence: a held verdict ended by progress resuming on every rank (its steps came), then the same
rank held again at the same line. The held verdict is the real one the watcher said on sleep.jsonl
(rank 2 asleep inside its loop at hang_train.py:199); resuming and pausing again are fed to the
watcher's own functions (verdicts.resumed, verdicts.report) as its loop calls them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ddp_preflight.hangwatch import verdicts
from ddp_preflight.hangwatch.model import Evidence, Kind
from ddp_preflight.hangwatch.state import About, Said
from ddp_preflight.hangwatch.text import summary

from .test_hangwatch_watch import replay


def _held(tmp_path):
    header, watcher, events = replay("sleep", tmp_path, until=30.0)    # before the run was stopped
    held = next(e for e in events if e.verdict is not None)
    assert held.verdict.kind == "held"
    state = watcher.state
    run = next(iter(state.held))
    d = state.held[run]
    return state, run, replace(d, since=None)


def _pause(state, run, d, at, out):
    """The rank held the others up again `at` seconds (wall) into the run, 8 s into its pause."""
    verdicts.report(state, d, 8.0, at + 8.0, out, Said(About.STALL, d.kind, tuple(d.named), run=run), run=run)


@pytest.mark.parametrize("step", [10.0, 20.0])
def test_a_rank_that_pauses_at_one_line_each_step_is_one_straggler_notice_with_its_step_time(step, tmp_path):
    state, run, d = _held(tmp_path)
    began = state.held[run].since
    out: list = []
    verdicts.resumed(state, out)           # every rank moved again: its step came
    assert [e.event.kind for e in out] == ["resumed"]
    out.clear()
    for n in range(1, 4):                  # three more steps, each paused at the same line
        _pause(state, run, d, began + n * step, out)
        verdicts.resumed(state, out)
    said = [e.event for e in out if getattr(e, "event", None) is not None and e.event.verdict is not None]
    assert len(said) == 1, [e.text for e in said]
    slow = said[0].verdict
    assert (said[0].kind, slow.kind, slow.culprits, slow.certainty, slow.every) == \
        ("straggler", Kind.STRAGGLER, [2], "likely", step)
    assert not slow.kind.is_hang
    assert summary(slow) == ("not a hang: ranks 0,1,3 wait in all_reduce while rank 2 is idle at hang_train.py:199 "
                             f"(main); rank 2 held them up there again, {step:.0f} s after its last pause said, and "
                             "went on each time: a slow rank (a straggler)"), summary(slow)


def test_a_pause_at_another_line_is_held_again_not_a_straggler(tmp_path):
    # A checkpoint after steps paused somewhere else: its own held notice, likely.
    state, run, d = _held(tmp_path)
    began = state.held[run].since
    out: list = []
    verdicts.resumed(state, out)
    out.clear()
    moved = replace(d, evidence=[replace(e, frame="hang_train.py:240") if e.key == 2 else e for e in d.evidence])
    _pause(state, run, moved, began + 60.0, out)
    said = [e.event.verdict for e in out if getattr(e, "event", None) is not None and e.event.verdict is not None]
    assert [(v.kind, v.culprits, v.certainty) for v in said] == [(Kind.HELD, [2], "likely")]


def test_a_pause_that_never_went_on_is_no_straggler(tmp_path):
    # Without progress resuming in between, a second held verdict is the same stall, said once.
    state, run, d = _held(tmp_path)
    out: list = []
    _pause(state, run, d, state.held[run].since + 10.0, out)
    assert not [e for e in out if getattr(e, "event", None) is not None], out
    assert isinstance(d.evidence[0], Evidence)


def test_a_compute_bound_straggler_is_said_once_not_at_each_slow_step(tmp_path):
    # straggle.jsonl (real): rank 0 computes 15 s while the others wait: one straggler notice, then
    # progress resumed. Its next slow step (the same verdict again, 20 s later) says nothing new.
    header, watcher, events = replay("straggle", tmp_path, until=40.0)
    said = [e for e in events if e.verdict is not None]
    assert [e.kind for e in said] == ["straggler"] and "resumed" in [e.kind for e in events]
    state, d = watcher.state, said[0].verdict
    run = next(t.run for t in state.ranks.values())
    out: list = []
    verdicts.report(state, replace(d, since=None), 8.0, d.since + 28.0, out,
                    Said(About.STALL, Kind.STRAGGLER, tuple(d.named), run=run), run=run)
    assert not [e for e in out if getattr(e, "event", None) is not None], out


def test_a_straggler_offers_no_cause_of_a_wait_that_never_ends(tmp_path):
    # The held verdict's causes (a wait for a file that never comes, a debugging pause) are what its
    # pauses, each ended, excluded: a result never offers a fix for a cause it did not see.
    state, run, d = _held(tmp_path)
    assert d.causes
    began = state.held[run].since
    out: list = []
    verdicts.resumed(state, out)
    out.clear()
    _pause(state, run, d, began + 10.0, out)
    slow = next(e.event.verdict for e in out if getattr(e, "event", None) is not None and e.event.verdict)
    assert slow.kind is Kind.STRAGGLER and list(slow.causes) == [] and slow.every == 10.0


def test_a_straggler_that_pauses_at_two_lines_a_step_is_known_at_either(tmp_path):
    # The soak's straggler sleeps at two lines each step (its step's own pause, then its straggle):
    # held at one, then the other, then the first again. Its third pause is a straggler's.
    state, run, d = _held(tmp_path)
    began = state.held[run].since
    other = replace(d, evidence=[replace(e, frame="hang_train.py:197") if e.key == 2 else e for e in d.evidence])
    out: list = []
    verdicts.resumed(state, out)
    _pause(state, run, other, began + 10.0, out)
    verdicts.resumed(state, out)
    _pause(state, run, d, began + 20.0, out)
    said = [e.event.verdict for e in out if getattr(e, "event", None) is not None and e.event.verdict is not None]
    assert [(v.kind, v.every) for v in said] == [(Kind.HELD, None), (Kind.STRAGGLER, 10.0)]
