"""Verdicts that must not be certain and wrong (issue 27), replayed: what real agents sent during lab
runs of examples/hang_train.py (2 nodes x 2 ranks), recorded by tests/unit/artifacts/agent/record.py,
through the real Watcher on a driven clock. A subgroup's collective skipped by a member is named for
that group; once a hang is named, what it causes (the victims' timeouts and exits, torchrun's stop,
ddp-preflight's own freeze) is its consequence: one verdict, one bundle, kept to the run's end."""

from __future__ import annotations

import json

from ddp_preflight.hangwatch.causes import CAUSES
from ddp_preflight.hangwatch.model import Reason
from ddp_preflight.hangwatch.text import summary

from .test_hangwatch_watch import AGENT, replay

SUBGROUP = ("rank 1 never entered all_reduce #6 of group [0,1], where rank 0 waits; rank 1 waits in all_reduce #11 of "
            "the default group (hang_train.py:149)")
SUBGROUP_PLAIN = ("rank 1 never entered all_reduce of group [0,1] (hang_train.py:188), where rank 0 waits; rank 1 waits "
                  "in all_reduce at hang_train.py:150 (train_step) with ranks 2,3 (their connections show the group: "
                  "a second mesh of Gloo connections joins its members; no Flight Recorder numbers its collectives)")
SUBGROUP_UNSURE = ("ranks wait in different collectives: rank 0 in all_reduce at hang_train.py:188 (main); rank 1 in "
                   "all_reduce at hang_train.py:150 (train_step); rank 2 in all_reduce at hang_train.py:150 "
                   "(train_step); rank 3 in all_reduce at hang_train.py:150 (train_step); they wait in it at different "
                   "lines: a collective of a subgroup, or one only some ranks call; which rank diverged cannot be told "
                   "from where they wait (the Flight Recorder's numbers per group would say)")


def test_a_stack_older_than_a_ranks_last_work_is_never_where_it_ended(tmp_path):
    # raise.jsonl: every rank's only stack was taken 2 s into the run, at its import line
    # (hang_train.py:43); they trained for 12 s more, then rank 1 raised and the others followed.
    from ddp_preflight.hangwatch.render import incident_report
    from ddp_preflight.hangwatch.state import snapshot
    header, watcher, events = replay("raise", tmp_path)
    ended = [t for t in watcher.state.ranks.values() if t.ended]
    assert len(ended) == 4 and all(t.stack_at < t.busy_at for t in ended)
    views = snapshot(watcher.state, 0.0).ranks
    assert [(v.rank, v.state, v.frame, v.stack) for v in views] == [(r, "exited", None, None) for r in range(4)]
    assert "hang_train.py:43" not in incident_report(snapshot(watcher.state, 0.0), {})


def _said(events):
    return [e for e in events if e.kind == "diagnosis"]


def _kept(events, watcher):
    """The run's verdict as a launch keeps it (ddp_preflight/launch/watched.py's RunVerdict) for a run that failed."""
    from ddp_preflight.launch.outcome import LaunchedRank, LaunchResult
    from ddp_preflight.launch.watched import RunVerdict
    kept = RunVerdict()
    for e in events:
        kept.heard(e)
    failed = LaunchResult([LaunchedRank(0, "master", 0, exit=1)], [], None, "master", 60.0)
    return kept.of(failed, watcher.verdict())


def test_a_subgroup_collective_skipped_by_rank_1_names_rank_1_for_that_group(tmp_path):
    # subgroup.jsonl (--flight): ranks 0,1 all_reduce on new_group([0, 1]) each step; from step 5
    # rank 1 skips it. Rank 0 waits in the subgroup's all_reduce, ranks 1,2,3 in the default
    # group's: rank 0 is one behind in the default group's numbers, which say nothing of it.
    header, watcher, events = replay("subgroup", tmp_path)
    said = _said(events)
    assert len(said) == 1, [e.text for e in events]
    d = said[0].snapshot.diagnosis
    assert (d.kind, d.culprits, d.candidates, d.reason, d.certainty, d.group, list(d.group_ranks)) == \
        ("mismatch", [header["rank"]], [], "skipped-group", "likely", "1", [0, 1]) and header["rank"] == 1
    assert summary(d) == SUBGROUP, summary(d)
    assert [c.what for c in d.causes] == [c.what for c in CAUSES[Reason.SKIPPED_GROUP]]


def test_without_a_flight_recorder_the_ranks_connections_show_the_subgroup_and_the_member_that_skipped(tmp_path):
    # subgroup-plain.jsonl: the same shape, no Flight Recorder (an attached run that did not opt in):
    # every rank waits in all_reduce, rank 0 at another line. Their connections show the group:
    # Gloo joined ranks 0,1 by a second mesh (new_group([0, 1])), every other pair by one. Two
    # calls of one group's all_reduce would have met: rank 0 waits in the subgroup's, and rank 1,
    # its other member, waits elsewhere with ranks 2,3: it never entered it. Likely, not certain.
    header, watcher, events = replay("subgroup-plain", tmp_path)
    said = _said(events)
    assert len(said) == 1, [e.text for e in events]
    d = said[0].snapshot.diagnosis
    assert (d.kind, d.culprits, d.candidates, d.reason, d.certainty, d.group, list(d.group_ranks)) == \
        ("mismatch", [header["rank"]], [], "skipped-group", "likely", None, [0, 1]) and header["rank"] == 1
    assert summary(d) == SUBGROUP_PLAIN, summary(d)


def test_without_a_flight_recorder_or_the_connections_ranks_at_different_lines_are_never_a_culprit(tmp_path,
                                                                                                  monkeypatch):
    # The same recording with the connections taken out (an older agent): which one diverged the
    # places cannot say: no culprit, every rank a candidate, and never "a peer or the link is gone".
    _links_counted_between_samples_only_before("subgroup-plain", 0.0, tmp_path, monkeypatch)
    header, watcher, events = replay("subgroup-plain", tmp_path)
    said = _said(events)
    assert len(said) == 1, [e.text for e in events]
    d = said[0].snapshot.diagnosis
    assert (d.kind, d.culprits, d.candidates, d.reason, d.certainty) == \
        ("mismatch", [], [0, 1, 2, 3], "different-collective", "unsure")
    assert summary(d) == SUBGROUP_UNSURE, summary(d)


def _links_counted_between_samples_only_before(name, at, tmp_path, monkeypatch):
    """The recording `name`, its samples' counts of the connections from `at` on taken out: the
    agent's count between samples (every few of them) missed what was made since."""
    from . import test_hangwatch_watch
    lines = (AGENT / f"{name}.jsonl").read_text().splitlines()
    out = [lines[0]]
    for line in lines[1:]:
        record = json.loads(line)
        msg = record.get("msg")
        if isinstance(msg, dict) and msg.get("type") == "sample" and record["at"] >= at:
            for rank in msg.get("ranks", ()):
                rank.pop("links", None)
                rank.pop("endpoints", None)
        out.append(json.dumps(record))
    (tmp_path / f"{name}.jsonl").write_text("\n".join(out) + "\n")
    monkeypatch.setattr(test_hangwatch_watch, "AGENT", tmp_path)


def test_a_subgroup_made_just_before_the_stall_is_seen_in_the_connections_counted_with_the_stacks(tmp_path,
                                                                                               monkeypatch):
    # subgroup-stacked.jsonl: subgroup-plain's shape, recorded by the agent that counts each rank's
    # connections with its stack. Its samples counted the subgroup's second mesh at 11.05 s, 0.16 s
    # before the fault (11.21 s); on CI's loaded box that count came after the verdict (every few
    # samples: the ranks' sockets had settled since the world's mesh), and the verdict was "unsure,
    # every rank a candidate". Without that count the connections read with the stall's stacks
    # show the group.
    _links_counted_between_samples_only_before("subgroup-stacked", 8.0, tmp_path, monkeypatch)
    header, watcher, events = replay("subgroup-stacked", tmp_path)
    said = _said(events)
    assert len(said) == 1, [e.text for e in events]
    d = said[0].snapshot.diagnosis
    assert (d.kind, d.culprits, d.candidates, d.reason, d.certainty, d.group, list(d.group_ranks)) == \
        ("mismatch", [header["rank"]], [], "skipped-group", "likely", None, [0, 1]) and header["rank"] == 1
    assert summary(d) == SUBGROUP_PLAIN, summary(d)


def test_a_timeout_cascade_is_the_consequence_of_the_hang_named_first(tmp_path):
    # cascade.jsonl: init_process_group(timeout=20 s); rank 0 sleeps 90 s at step 5. The hang is
    # named while the others wait; 20 s later their all_reduce times out, they exit 1, torchrun
    # stops the rest. None of it is a new verdict or a new bundle; the run's verdict stays rank 0.
    header, watcher, events = replay("cascade", tmp_path)
    said = _said(events)
    assert len(said) == 1, [e.text for e in events]
    d = said[0].snapshot.diagnosis
    assert (d.kind, d.culprits, d.candidates) == ("deadlock", [header["rank"]], []) and header["rank"] == 0
    assert sum(1 for e in events if e.kind == "rank-gone") == 4           # every rank did end after it
    assert [e.kind for e in events].count("incident") == 1
    assert (watcher.state.diagnosis.kind, watcher.state.diagnosis.culprits) == ("deadlock", [0])
    kept = _kept(events, watcher)
    assert (kept.kind, list(kept.culprits)) == ("deadlock", [0])
    assert summary(kept) == summary(d)


def test_ddp_preflights_own_freeze_of_a_deadlocked_run_is_no_second_verdict(tmp_path):
    # freeze.jsonl (--flight): rank 2 left the loop; 14 s after, every rank was frozen (SIGSTOP)
    # as ddp-preflight's stop does, master's ranks first and worker1's 6 s later, and the watcher
    # told that ddp-preflight began stopping the run (when the freeze began).
    lines = (AGENT / "freeze.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    hello = next(json.loads(line) for line in lines[1:] if '"hello"' in line)
    began = hello["msg"]["time"] - hello["at"]
    stop = [(header["frozen_at"], lambda w: w.launcher_stopping(None, began + header["frozen_at"], "ddp-preflight"))]
    header, watcher, events = replay("freeze", tmp_path, then=stop)
    said = _said(events)
    assert len(said) == 1, [e.text for e in events]
    d = said[0].snapshot.diagnosis
    assert (d.kind, d.culprits, d.reason) == ("deadlock", [2], "left-loop") and header["rank"] == 2
    assert [e.kind for e in events].count("incident") == 1
    assert (_kept(events, watcher).kind, list(_kept(events, watcher).culprits)) == ("deadlock", [2])


def test_a_rank_alone_in_its_final_barrier_is_uneven_data_with_its_remedies(tmp_path):
    # drained.jsonl (--flight): rank 3 ran out of batches at step 5 and waits in its final
    # dist.barrier() while the others call all_reduce.
    from ddp_preflight.hangwatch.causes import END_OF_ITS_DATA
    header, watcher, events = replay("drained", tmp_path)
    said = _said(events)
    assert len(said) == 1, [e.text for e in events]
    d = said[0].snapshot.diagnosis
    assert (d.kind, d.culprits, d.reason, d.certainty) == ("mismatch", [3], "different-collective", "certain")
    assert d.causes[0] == END_OF_ITS_DATA and any("Join" in step for fix in d.causes[0].fixes for step in fix.steps)
