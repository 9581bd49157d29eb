"""The tick judges only when something changed (issue 36): an input since it last judged, or a bound
a verdict reads that time has passed (hangwatch/due.py). A stall that stands cost every rank's
evidence, each run's pipeline and every bound on every tick (4 Hz) before.

Each recording of tests/unit/artifacts/agent is replayed twice through the real Watcher on a driven
clock: as it is, and with the tick made to judge every time (what it did before); what is said, when,
and what the dashboard's snapshot shows between ticks must be the same. Options move the bounds
(a shorter threshold, a held bound and an endless bound that pass between samples)."""

from __future__ import annotations

import copy
import json

import pytest

from ddp_preflight.hangwatch import due, kept, reducer
from ddp_preflight.hangwatch.evidence import evidence_of
from ddp_preflight.hangwatch.model import Kind

from .test_hangwatch_watch import AGENT, replay

RECORDINGS = sorted(p.stem for p in AGENT.glob("*.jsonl"))
OPTIONS = {
    "default": {},
    "threshold-5.3": {"threshold": 5.3},               # bounds that fall between the samples' seconds
    "held-3.1": {"held_after": 3.1},                    # a held rank's bound (sleep, cascade)
    "endless-6.7": {"endless_after": 6.7},              # a straggler that never arrives (straggle)
}


def _length(name: str, source=AGENT) -> float:
    lines = (source / f"{name}.jsonl").read_text().splitlines()[1:]
    return max(json.loads(line)["at"] for line in lines)


def _played(name, tmp_path, folder, source=AGENT, **options):
    """What was said (kind, when, its line, its verdict) and what snapshots showed every half second."""
    shown = []

    def look(watcher):
        snap = watcher.snapshot()
        shown.append((snap.diagnosis, [(v.rank, v.pid, v.state, v.idle_for, v.frame, v.stack) for v in snap.ranks]))

    looks = [(k * 0.5 + 0.1, look) for k in range(int(_length(name, source) * 2) + 4)]
    _, watcher, events = replay(name, tmp_path / folder, then=looks, folder=source, **options)
    said = [(e.kind, e.data.get("at"), e.text if e.kind != "incident" else None,
             e.snapshot.diagnosis if e.snapshot is not None else None) for e in events]
    return said, shown, watcher


@pytest.mark.parametrize("options", list(OPTIONS), ids=list(OPTIONS))
@pytest.mark.parametrize("name", RECORDINGS)
def test_judging_on_change_says_what_judging_every_tick_said_at_the_same_ticks(name, options, tmp_path, monkeypatch):
    said, shown, watcher = _played(name, tmp_path, "on-change", **OPTIONS[options])
    with monkeypatch.context() as m:
        m.setattr(due, "next_due", lambda state, now: now)      # every tick judges, as before issue 36
        said_before, shown_before, before = _played(name, tmp_path, "every-tick", **OPTIONS[options])
    assert said == said_before
    assert shown == shown_before
    assert watcher.state.judgements <= before.state.judgements


def _varied(name: str, folder, vary) -> None:
    """The recording NAME with each rank's sample passed through vary(at, fault_at, sample), in folder."""
    lines = (AGENT / f"{name}.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    out = [lines[0]]
    for line in lines[1:]:
        record = json.loads(line)
        if record["msg"].get("type") == "sample":
            record["msg"]["ranks"] = [vary(record["at"], header["fault_at"], dict(r)) for r in record["msg"]["ranks"]]
        out.append(json.dumps(record))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.jsonl").write_text("\n".join(out) + "\n")


def _flicker(at, fault_at, sample):
    """A quiet rank's CPU figure and its helpers' as a loaded box shows them, each second another
    (0% to 4%, all under IDLE_CPU), and a rank running or asleep as the kernel caught it: what no
    rule decides by."""
    figures = (0.0, 0.4, 1.0, 2.6, 4.4)
    for key in ("cpu", "children_cpu"):
        if isinstance(sample.get(key), (int, float)) and sample[key] < reducer.stall.IDLE_CPU:
            sample[key] = figures[(sample["pid"] + int(at) + len(key)) % len(figures)]
    if sample.get("state") in ("R", "S"):
        sample["state"] = "RS"[(sample["pid"] + int(at)) % 2]
    return sample


def _blip(at, fault_at, sample):
    """After the fault, every rank busy for one sample in six (a timer, a retry, a log flush): each
    such sample ends a quiet time, which the judging reads."""
    if at > fault_at and int(at - fault_at) % 6 == 3 and sample.get("cpu") is not None:
        sample["cpu"] = 40.0
    return sample


@pytest.mark.parametrize("vary", [_flicker, _blip], ids=["flicker", "blip"])
@pytest.mark.parametrize("name", RECORDINGS)
def test_samples_nobody_recorded_are_judged_on_change_as_every_tick(name, vary, tmp_path, monkeypatch):
    # Variants of every recording: figures that flicker (no judging for them), and samples that end
    # a quiet time between the bounds (judged at the next tick, as judging every tick would).
    _varied(name, tmp_path / "varied", vary)
    said, shown, watcher = _played(name, tmp_path, "on-change", source=tmp_path / "varied")
    with monkeypatch.context() as m:
        m.setattr(due, "next_due", lambda state, now: now)
        said_before, shown_before, before = _played(name, tmp_path, "every-tick", source=tmp_path / "varied")
    assert said == said_before
    assert shown == shown_before
    if vary is _flicker:
        recorded = _played(name, tmp_path, "recorded")[2].state.judgements
        if all(d is None or Kind(d.kind).is_hang for *_, d in said):
            assert watcher.state.judgements == recorded     # figures alone: judged exactly as often
        else:
            # A verdict that is no hang is said again at each judging, with its ranks' figures: a
            # sample that moves them is judged (verdicts._restate), and no tick between samples.
            assert recorded <= watcher.state.judgements < before.state.judgements


def test_a_rank_kept_evidence_is_its_evidence_read_afresh(tmp_path, monkeypatch):
    # kept.evidence is built again only after an input that moved what it reads (a sample's figures
    # included): at every judging of every recording, and of its flickering variant, it is what
    # evidence_of reads from the state then.
    real, checked = kept.evidence, []

    def compared(state, t, now, unformed=None):
        found = real(state, t, now, unformed)
        assert found == evidence_of(state, t, now, unformed), (t.key, now)
        checked.append(now)
        return found

    monkeypatch.setattr(kept, "evidence", compared)
    for name in RECORDINGS:
        replay(name, tmp_path / name)
        _varied(name, tmp_path / "varied", _flicker)
        replay(name, tmp_path / f"{name}-varied", folder=tmp_path / "varied")
    assert len(checked) > 1000


def test_a_sample_that_moves_a_figure_alone_is_no_change_but_its_evidence_shows_it(tmp_path):
    # The recorded deadlock, named; then worker1's last sample again, then with rank 2's CPU figure
    # moved (0% to 3%, still quiet): no judging, yet its evidence read next says 3%. Then busy (40%):
    # its quiet time ended, a change.
    header, watcher, events = replay("leave", tmp_path, until=header_of("leave")["fault_at"] + 12.0)
    watcher.tick()
    state, now = watcher.state, watcher.clock()
    last = [json.loads(line) for line in (AGENT / "leave.jsonl").read_text().splitlines()[1:]]
    sample = [r for r in last if r["at"] <= now and r["node"] == "worker1" and r["msg"]["type"] == "sample"][-1]["msg"]
    watcher.receive("worker1", sample)
    rank2 = next(t for t in state.live() if t.view.rank == 2)
    kept.evidence(state, rank2, now)
    changes = state.changes
    watcher.receive("worker1", sample)
    assert state.changes == changes
    assert "CPU 3%" not in kept.evidence(state, rank2, now).notes
    moved = {**sample, "ranks": [{**r, "cpu": 3.0} if r["pid"] == rank2.view.pid else r for r in sample["ranks"]]}
    watcher.receive("worker1", moved)
    assert state.changes == changes
    assert kept.evidence(state, rank2, now) == evidence_of(state, rank2, now)
    assert "CPU 3%" in kept.evidence(state, rank2, now).notes
    busy = {**sample, "ranks": [{**r, "cpu": 40.0} if r["pid"] == rank2.view.pid else r for r in sample["ranks"]]}
    watcher.receive("worker1", busy)
    assert state.changes == changes + 1 and rank2.idle_since is None


def header_of(name: str) -> dict:
    return json.loads((AGENT / f"{name}.jsonl").read_text().splitlines()[0])


def test_a_skipped_tick_is_one_whose_judging_would_have_changed_nothing(tmp_path, monkeypatch):
    # Stronger than the same events: at every tick that skips, a copy of the state judged anyway
    # says nothing, asks nothing, and leaves what the next judging reads as it was.
    real = reducer._tick
    skipped = []

    def checked(state, now, wall, out):
        shadow = copy.deepcopy(state)
        judged = state.judgements
        real(state, now, wall, out)
        if state.judgements != judged:
            return
        shadow_out: list = []
        real(shadow, now, wall, shadow_out)               # skips too: the same time-keeping parts
        before = reducer._judged_marks(shadow, shadow_out)
        reducer._judge(shadow, now, wall, shadow_out)
        after = reducer._judged_marks(shadow, shadow_out)
        assert after[0] == before[0] and all(a is b for a, b in zip(after[1:], before[1:], strict=True)), \
            (now, shadow_out[len(out):])
        skipped.append(now)

    monkeypatch.setattr(reducer, "_tick", checked)
    for name in ("leave", "sleep", "cascade", "quit", "straggle"):
        replay(name, tmp_path / name, held_after=20.0)
    assert len(skipped) > 100


def test_a_standing_hang_is_not_judged_again_while_nothing_comes(tmp_path, monkeypatch):
    # The recorded deadlock, named; then 4 s with no message (under the silent bound: no node is
    # lost). Before, every one of those 16 ticks judged the run again over every rank.
    header = json.loads((AGENT / "leave.jsonl").read_text().splitlines()[0])
    header, watcher, events = replay("leave", tmp_path, until=header["fault_at"] + 12.0)
    assert [e.kind for e in events].count("diagnosis") == 1
    watcher.tick()                  # the last message taken
    stalls = []
    real = reducer.verdicts.stalled
    monkeypatch.setattr(reducer.verdicts, "stalled", lambda *a, **k: stalls.append(a[2]) or real(*a, **k))
    clock = watcher.clock()
    judged = watcher.state.judgements
    now = [clock]
    watcher.clock = lambda: now[0]
    for _ in range(16):
        now[0] += 0.25
        watcher.tick()
    # Only at the bounds that fall within those 4 s: the stall's ask's timeout, then its stacks'
    # recheck, which asks again (an effect: judged at the next tick too). Before: 16 of 16.
    assert len(stalls) <= 3 and watcher.state.judgements - judged <= 3, stalls
    assert [e.kind for e in events].count("diagnosis") == 1


def _named_at(tmp_path, **options) -> float:
    _, _, events = replay("leave", tmp_path, **options)
    return next(e.data["at"] for e in events if e.kind == "diagnosis")


def test_a_bound_between_samples_is_judged_at_the_first_tick_past_it(tmp_path, monkeypatch):
    # Rank 3 leaves the loop; the others wait in all_reduce. With a threshold of 6.1 s the stall's
    # bound passes between two samples (11.781 and 12.781 s, each a second after the last): the
    # tick past it (12.031) names the deadlock, as judging every tick did, not the next sample.
    at = _named_at(tmp_path / "on-change", threshold=6.1)
    assert at == pytest.approx(12.031)
    with monkeypatch.context() as m:
        m.setattr(due, "next_due", lambda state, now: now)
        assert _named_at(tmp_path / "every-tick", threshold=6.1) == at
    with monkeypatch.context() as m:
        # Inputs alone: the samples of ranks that go on waiting move nothing the judging reads
        # (due.sample_reads), so it waits for the next that does: the stacks answered at 20.872 s.
        m.setattr(due, "next_due", lambda state, now: None)
        assert _named_at(tmp_path / "inputs-only", threshold=6.1) == pytest.approx(21.122)


def test_next_due_is_the_earliest_bound_still_ahead():
    state = reducer.new_state(["a"], reducer.Config(threshold=8.0))
    assert due.next_due(state, 10.0) is None                       # nothing reads the clock
    state.asked_at = 3.0
    assert due.next_due(state, 10.0) == 3.0 + reducer.stall.ASK_TIMEOUT
    state.exit_check_at = 12.0
    assert due.next_due(state, 10.0) == 12.0
    assert due.next_due(state, 12.5) == 12.5                       # ends awaited: every tick until judged
    state.exit_check_at = None
    assert due.next_due(state, 18.0) == 18.0                       # a bound just now is due now
    assert due.next_due(state, 18.5) is None                       # passed: judged already


def test_a_ranks_stack_age_is_a_bound_only_while_it_is_alone():
    # alone.judge asks a rank's stack again each threshold, of ranks alone only (no TCP connection):
    # a rank that has one gives no bound by its stack's age (each one did before: a judging of every
    # rank each threshold after each stack, in every stall).
    from ddp_preflight.hangwatch.model import RankView
    from ddp_preflight.hangwatch.state import Track

    state = reducer.new_state(["a"], reducer.Config(threshold=8.0))
    t = Track(RankView("a", 100, rank=0, world_size=2), stack_at=3.0)
    state.ranks[("a", 100)] = t
    assert due.next_due(state, 10.0) is None
    t.alone_since = 1.0
    assert due.next_due(state, 10.0) == 3.0 + 8.0                                  # before 1 + ALONE_AFTER
    t.stack_at = None
    assert due.next_due(state, 10.0) == 1.0 + reducer.ALONE_AFTER                   # alone, no stack yet


def test_a_held_verdict_that_stands_is_judged_at_its_samples_and_its_wait_grows_between(tmp_path):
    # sleep: rank 2 sleeps in its own code while the others wait in all_reduce, said held at 18.2 s.
    # Replayed to worker1's sample at 21.244 s, then five ticks an eighth of a second apart with no
    # input: the sample is judged (the verdict shows its ranks' CPU), no tick after it is (each was,
    # to restate how long they waited), and the dashboard's wait still grows with the clock, from
    # when it began (the verdict's since).
    _, watcher, events = replay("sleep", tmp_path, until=21.3)
    clock = watcher.clock()
    offset = watcher.wall() - clock
    now = [clock]
    watcher.clock, watcher.wall = (lambda: now[0]), (lambda: offset + now[0])
    judged, seen = watcher.state.judgements, []
    for _ in range(5):
        now[0] += 0.125
        watcher.tick()
        snap = watcher.snapshot()
        assert snap.diagnosis.kind == "held" and snap.diagnosis.waited == round(snap.time - snap.diagnosis.since, 1)
        seen.append((watcher.state.judgements - judged, snap.diagnosis.waited))
    assert seen == [(1, 11.2), (1, 11.3), (1, 11.5), (1, 11.6), (1, 11.7)]


def test_a_hang_named_keeps_the_wait_it_was_named_after(tmp_path):
    # straggle with --endless-after 6.7: rank 0 named computing for ever after 8.3 s of the others'
    # wait. A hang stands as said (no verdict of its run after it): each snapshot after shows 8.3 s,
    # not a wait that counts on as a held rank's does.
    seen = []
    looks = [(k * 0.5 + 0.1, lambda w: seen.append(w.snapshot().diagnosis)) for k in range(int(_length("straggle") * 2))]
    _, watcher, events = replay("straggle", tmp_path, endless_after=6.7, then=looks)
    named = next(e for e in events if e.kind == "diagnosis").snapshot.diagnosis
    assert (named.kind, named.culprits, named.waited) == ("endless", [0], 8.3)
    after = [d.waited for d in seen if d is not None and d.kind == "endless"]
    assert len(after) > 10 and set(after) == {8.3}
