"""The ranks nobody sees are grouped by why, from the field that says it (Evidence.unseen), never from
whatever note happens to come first (issue 35: text.py read notes[0] by position)."""

from __future__ import annotations

from ddp_preflight.hangwatch.classify import classify
from ddp_preflight.hangwatch.diagnose import diagnose
from ddp_preflight.hangwatch.model import Evidence, RankStatus
from ddp_preflight.hangwatch.text import summary

from .test_hangwatch_classify import dump


def test_unseen_ranks_are_grouped_by_their_why_whatever_their_notes_say_first():
    waiting = classify(dump("deadlock_rank0_all_reduce.json"), 0.0).as_evidence("master", 100, 0)
    lost = "not watched: worker1's agent is gone"
    ranks = {0: waiting,
             # the same why, with other notes first (a sample's CPU, the kernel's word) or none at all
             2: Evidence("worker1", 102, 2, RankStatus.UNKNOWN, notes=("CPU 3%",), unseen=lost),
             3: Evidence("worker1", 103, 3, RankStatus.UNKNOWN, unseen=lost),
             # a note that is no why at all never becomes one
             1: Evidence("master", 101, 1, RankStatus.UNKNOWN, notes=("CPU 0%",),
                         unseen="no stack: py-spy could not read this process")}
    found = diagnose(ranks)
    assert found.kind == "unseen" and found.culprits == ()
    assert summary(found) == ("rank 0 waits in all_reduce; rank 1 unknown (no stack: py-spy could not read this "
                              "process); ranks 2,3 unknown (not watched: worker1's agent is gone): a hang cannot be "
                              "told from a straggler"), summary(found)


def test_a_stack_py_spy_could_not_read_says_so_in_its_field():
    state = classify(None, None)
    assert state.as_evidence("master", 100, 0).unseen == "no stack: py-spy could not read this process"
    assert classify(dump("deadlock_rank0_all_reduce.json"), 0.0).as_evidence("master", 100, 0).unseen is None
