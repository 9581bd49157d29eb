"""Every rank's stack grouped (hangwatch/stacks.py) and the ranks lined up by sequence number
(hangwatch/sequence.py), on the recorded py-spy stacks of the deadlock snapshot."""

from __future__ import annotations

import copy
from dataclasses import replace

from ddp_preflight.hangwatch.ended_text import joined as said
from ddp_preflight.hangwatch.model import Diagnosis, Evidence, Kind, RankView
from ddp_preflight.hangwatch.sequence import Entered, join
from ddp_preflight.hangwatch.stacks import StackGroup, group_stacks, joined, stacks_view
from ddp_preflight.hangwatch.words import ranges, ranks_of

from .wide_snapshots import deadlock_of_64

WIDE = deadlock_of_64(odd=32)
WAITING = WIDE.ranks[0].stack          # the recorded rank in all_reduce: 4 frames, innermost first
LEFT = WIDE.ranks[32].stack            # the recorded rank that left the loop: idle at hang.py:11


def ranks(*stacks: list[dict] | None) -> list[RankView]:
    return [RankView("master", 100 + r, rank=r, stack=copy.deepcopy(s)) for r, s in enumerate(stacks)]


def test_64_ranks_with_one_odd_rank_read_as_two_groups_the_odd_one_marked():
    groups = group_stacks(WIDE.ranks)
    assert groups == (StackGroup(WAITING, tuple(r for r in range(64) if r != 32), differs=False),
                      StackGroup(LEFT, (32,), differs=True))
    assert [ranks_of(g.ranks) for g in groups] == ["ranks 0-31,33-63", "rank 32"]
    assert [f["function"] for f in groups[0].stack] == ["all_reduce", "_exception_logger.<locals>.wrapper",
                                                         "train_step", "<module>"]


def test_one_stack_for_all_is_one_group_and_none_differs():
    assert group_stacks(ranks(WAITING, WAITING, WAITING)) == (StackGroup(WAITING, (0, 1, 2), differs=False),)


def test_groups_by_size_then_lowest_rank_and_a_changed_line_is_another_stack():
    moved = copy.deepcopy(WAITING)
    moved[2]["line"] = 7                   # the same functions, train_step one line further
    groups = group_stacks(ranks(moved, WAITING, LEFT, WAITING, moved, moved))
    assert [(g.ranks, g.differs) for g in groups] == [((0, 4, 5), False), ((1, 3), True), ((2,), True)]
    tie = group_stacks(ranks(LEFT, WAITING, WAITING, LEFT))
    assert [(g.ranks, g.differs, g.stack == LEFT) for g in tie] == [((0, 3), False, True), ((1, 2), True, False)]


def test_ranks_without_a_stack_come_last_unmarked_and_unnumbered_ranks_by_pid():
    views = ranks(None, WAITING, WAITING, LEFT, None)
    views.append(RankView("worker1", 4242, rank=None, stack=copy.deepcopy(LEFT)))
    groups = group_stacks(views)
    assert [(ranks_of(g.ranks), g.differs, g.stack is None) for g in groups] == [
        ("ranks 1,2", False, False), ("rank 3 and pid 4242", True, False), ("ranks 0,4", False, True)]
    assert group_stacks([]) == ()


def test_ranges():
    assert [ranges(r) for r in ([5], [0, 1, 3], [0, 1, 2], [3, 1, 2, 2], [0, 1, 2, 4, 6, 7, 8, 9],
                                      [r for r in range(64) if r != 32], [])] == \
        ["5", "0,1,3", "0-2", "1-3", "0-2,4,6-9", "0-31,33-63", ""]


def test_a_named_hang_with_the_flight_recorders_numbers_joins_the_ranks():
    view = stacks_view(WIDE.ranks, WIDE.diagnosis)
    assert view.joined is not None
    assert said(view.joined) == ("rank 32 never entered all_reduce #12 (its last: #11 all_reduce; it was at hang.py:11), "
                                 "which ranks 0-31,33-63 issued at hang.py:6")
    assert (view.ranks, len(view.groups)) == (64, 2)


def test_no_joined_line_without_a_hang_or_without_sequence_numbers():
    assert WIDE.diagnosis is not None
    assert joined(None) is None
    assert joined(replace(WIDE.diagnosis, kind=Kind.STRAGGLER)) is None
    unnumbered = [replace(e, seq=None, seq_op=None, completed=None) for e in WIDE.diagnosis.evidence]
    assert joined(replace(WIDE.diagnosis, evidence=unnumbered)) is None
    one = [e if e.rank == 0 else replace(e, seq=None) for e in WIDE.diagnosis.evidence]
    assert joined(replace(WIDE.diagnosis, evidence=one)) is None


def test_ranks_behind_at_one_place_are_said_once_and_none_behind_is_said():
    def seen(rank: int, seq: int, frame: str) -> Evidence:
        return Evidence("master", 100 + rank, rank, seq=seq, seq_op="all_reduce", completed=seq - 1, frame=frame)
    behind = [seen(r, 11 if r in (4, 5, 6, 9) else 12, "train.py:80" if r in (4, 5, 6, 9) else "train.py:88")
              for r in range(10)]
    d = Diagnosis(Kind.DEADLOCK, culprits=(4, 5, 6, 9), evidence=tuple(behind))
    assert said(joined(d)) == ("ranks 4-6,9 never entered all_reduce #12 (their last: #11 all_reduce; they were at "
                         "train.py:80), which ranks 0-3,7,8 issued at train.py:88")
    level = Diagnosis(Kind.NETWORK_STALL, evidence=tuple(seen(r, 12, "train.py:88") for r in range(4)))
    assert said(joined(level)) == "ranks 0-3 all entered all_reduce #12 at train.py:88: none is behind"


def test_the_join_is_the_one_explain_uses():
    # explain's own entries (with the line that says so) go through the same join.
    from ddp_preflight.explain.join import Entered as ExplainEntered
    from ddp_preflight.explain.seen import Quote
    quote = Quote("flight-rank-1.json", None, "rank 1: collective #3 all_reduce scheduled")
    found = join([ExplainEntered(1, 3, "all_reduce", 2, None, quote), Entered(0, 4, "broadcast", 3, "t.py:9")])
    assert found is not None
    assert (found.behind, found.ahead, found.seq, found.op, found.frame) == ((1,), (0,), 4, "broadcast", "t.py:9")
    assert found.entered[1].quote == quote  # type: ignore[attr-defined]


def test_native_frames_group_by_their_names_not_their_addresses():
    # Two real processes blocked at the same line, --native: the same Python frames and named
    # native functions, other raw addresses (where each loaded libc). One group, as the dashboard
    # builds each rank's stack (evidence.shown: frames_of the dump).
    import json
    from pathlib import Path

    from ddp_preflight.hangwatch.classify import frames_of
    pyspy = Path(__file__).parent / "artifacts" / "pyspy"
    stacks = [[{"function": f.function, "file": f.file, "line": f.line}
               for f in frames_of(json.loads((pyspy / name).read_text()))]
              for name in ("native_renamed_main.json", "native_renamed_main_2.json")]
    assert stacks[0] != stacks[1]                       # the addresses differ
    groups = group_stacks(ranks(*stacks))
    assert [(g.ranks, g.differs) for g in groups] == [((0, 1), False)]
    assert [f["function"] for f in groups[0].stack][2:5] == ["PyThread_acquire_lock_timed",
                                                             "lock_PyThread_acquire_lock", "<module>"]


def test_the_incident_report_lists_a_stack_once_for_the_ranks_that_share_it():
    import json
    from pathlib import Path

    from ddp_preflight.hangwatch.classify import frames_of
    from ddp_preflight.hangwatch.model import Snapshot
    from ddp_preflight.hangwatch.render import incident_report
    pyspy = Path(__file__).parent / "artifacts" / "pyspy"
    stacks = [[{"function": f.function, "file": f.file, "line": f.line}
               for f in frames_of(json.loads((pyspy / name).read_text()))]
              for name in ("native_renamed_main.json", "native_renamed_main_2.json")]
    report = incident_report(Snapshot(time=0.0, threshold=8.0, ranks=ranks(*stacks)), {}).splitlines()
    start = report.index("stacks (innermost first; ranks with the same stack together):")
    assert report[start + 1] == "  rank 0 on master (pid 100), rank 1 on master (pid 101):"
    assert report[start + 2:start + 8] == ["    libc.so.6:0 0x7efe1c0a3f16", "    libc.so.6:0 0x7efe1c0aed90",
                                           "    libpython3.11.so.1.0:0 PyThread_acquire_lock_timed",
                                           "    libpython3.11.so.1.0:0 lock_PyThread_acquire_lock",
                                           "    renamed_main.py:15 <module>", "    libc.so.6:0 0x7efe1c04524a"]
