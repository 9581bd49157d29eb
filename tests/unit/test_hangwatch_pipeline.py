"""The one pipeline that decides a stalled run's verdict (hangwatch/diagnose.py): ordered rules, each
a pure function of the run's evidence that decides or passes, the first decision final; over the
recorded real py-spy dumps (artifacts/pyspy) and a recorded lab run's agent messages."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

from ddp_preflight.hangwatch.classify import classify
from ddp_preflight.hangwatch.diagnose import RULES, Hold, decide
from ddp_preflight.hangwatch.evidence import evidence_of
from ddp_preflight.hangwatch.model import Kind, Reason
from ddp_preflight.hangwatch.model import RankStatus as S
from ddp_preflight.hangwatch.rendezvous import Torchrun, torchruns_waiting
from ddp_preflight.hangwatch.stalled import Stall
from ddp_preflight.hangwatch.state import About, Said
from ddp_preflight.hangwatch.text import summary
from ddp_preflight.hangwatch.waiting import straggler
from ddp_preflight.node.protocol import StoreAnswer

from .test_hangwatch_watch import replay

PYSPY = Path(__file__).parent / "artifacts" / "pyspy"
WAITING = classify(json.loads((PYSPY / "deadlock_rank0_all_reduce.json").read_text()), 0.0, "futex_do_wait")
LEFT = classify(json.loads((PYSPY / "deadlock_rank1_left_loop.json").read_text()), 0.0, "hrtimer_nanosleep")
BUSY = classify(json.loads((PYSPY / "deadlock_rank1_left_loop.json").read_text()), 98.0)


def seen(states):
    return {r: s.as_evidence("master" if r < 2 else "worker1", 100 + r, r) for r, s in states.items()}


def decisions(s: Stall) -> list:
    """What each rule says of the run, in the pipeline's order."""
    return [rule(s) for rule in RULES]


def test_the_first_rule_that_decides_is_the_verdict_and_every_rule_is_pure():
    s = Stall(seen({0: WAITING, 1: LEFT, 2: WAITING, 3: WAITING}), waited=9.0, notes={"master": ("data-shards: x",)})
    said = decisions(s)
    first = next(d for d in said if d is not None)
    found = decide(s)
    assert (found.kind, found.culprits, found.reason) == (Kind.DEADLOCK, (1,), Reason.LEFT_LOOP)
    assert replace(found, notes=()) == first          # decide() adds only what preflight said of its nodes
    # given as words, the finding is read by the check its words begin with (notes.related)
    assert [(n.node, n.check, n.said) for n in found.notes] == [("master", "data-shards", "x")]
    assert decisions(s) == said                        # pure: the same evidence, the same decisions
    # The rules after the first decide things of their own; none of them is heard.
    assert [d.kind for d in said[said.index(first) + 1:] if d is not None and not isinstance(d, Hold)] != []


def test_a_straggler_that_never_arrives_is_decided_endless_by_one_rule_not_overridden():
    ranks = seen({0: WAITING, 1: BUSY, 2: WAITING, 3: WAITING})
    early, late = Stall(ranks, waited=12.0, endless=40.0), Stall(ranks, waited=41.0, endless=40.0)
    assert straggler(early).kind is Kind.STRAGGLER and straggler(late).kind is Kind.ENDLESS
    for s, kind in ((early, Kind.STRAGGLER), (late, Kind.ENDLESS)):
        said = [d for d in decisions(s) if d is not None]
        assert said[0].kind is kind and decide(s).kind is kind
    assert summary(decide(late)).startswith("rank 1 has computed for 41 s at hang.py:11")


def test_the_store_decides_who_never_checked_in_and_no_later_rule_changes_it():
    ranks = {r: replace(WAITING.as_evidence("master", 100 + r, r), state=S.RENDEZVOUS, op=None) for r in (0, 1, 2)}
    store = StoreAnswer(master="10.0.0.1:29500", checked_in=(0, 1, 2), world_size=4)
    s = Stall(ranks, waited=9.0, store=store, planned={3: "worker1"})
    found = decide(s)
    assert (found.kind, found.culprits, found.reason) == (Kind.RENDEZVOUS_STALL, (3,), Reason.NEVER_CHECKED_IN)
    assert decide(replace(s, store_coming=True)) is Hold.STORE_COMING        # its answer is coming: wait for it


def test_evidence_is_read_without_touching_the_dashboards_view(tmp_path):
    header, watcher, events = replay("leave", tmp_path, until=header_fault() + 9.0)
    state = watcher.state
    live = [t for t in state.ranks.values() if not t.ended]
    live[0].proc_state = "T"                           # the kernel holds it now: its evidence says so ...
    views = copy.deepcopy([t.view for t in live])
    evidence = [evidence_of(state, t, 100.0) for t in live]
    assert evidence[0].state is S.STOPPED
    assert [t.view for t in live] == views             # ... and the dashboard's view is untouched


def header_fault() -> float:
    return json.loads((Path(__file__).parent / "artifacts" / "agent" / "leave.jsonl").read_text().splitlines()[0])[
        "fault_at"]


def test_torchruns_that_wait_carry_their_node_rank_as_a_field_the_words_read():
    found = torchruns_waiting("10.0.0.1:29500", [Torchrun("master", 41, 0, 2)], ["master", "worker1"], 12.34)
    assert found is not None and (found.nodes, found.node_ranks, found.world) == (("worker1",), (1,), 2)
    assert [(e.node, e.node_rank, e.notes) for e in found.evidence] == [("master", 0, ())]
    assert summary(found).startswith("torchrun on master (node rank 0 of 2) has started no rank for 12 s")
    assert torchruns_waiting("10.0.0.1:29500", [Torchrun("master", 41, 0, 2), Torchrun("worker1", 42, 1, 2)],
                             ["master", "worker1"], 12.0) is None


def test_two_torchruns_claiming_one_node_rank_are_a_certain_verdict_with_its_cause():
    # $SLURM_NODEID expanded once by the batch script: both nodes' torchruns claim node rank 0.
    from ddp_preflight.hangwatch.causes import DUPLICATE_NODE_RANK
    found = torchruns_waiting("10.0.0.1:29500", [Torchrun("master", 41, 0, 2), Torchrun("worker1", 42, 0, 2)],
                              ["master", "worker1"], 30.2)
    assert found is not None
    assert (found.reason, found.certainty, found.nodes, found.node_ranks) == \
        (Reason.DUPLICATE_NODE_RANK, "certain", ("master", "worker1"), (1,))
    assert found.causes == DUPLICATE_NODE_RANK
    assert summary(found) == ("the torchruns of the run at 10.0.0.1:29500 number their nodes wrong: master and worker1 "
                              "both claim node rank 0 (of 2), so node rank 1 never comes and no rank starts (30 s)")


def test_what_is_said_once_stands_by_its_fields():
    assert not Said(About.STALL, Kind.DEADLOCK, (3,), run=1).stands
    assert Said(About.STALL, Kind.EXITED, (3,), run=1).stands
    assert Said(About.ENDS, Kind.EXITED, (3,), pids=(4242,)).stands
    assert Said(About.TORCHRUNS, Kind.RENDEZVOUS_STALL, store="10.0.0.1:29500", node_ranks=(1,)).stands


def test_a_rank_quiet_in_an_import_that_moves_no_byte_waits_on_io_and_is_not_working(tmp_path):
    # A live rank of a recording, given the real dump of a rank importing torch._dynamo and made
    # quiet: an import is working only while it uses CPU or moves bytes (a file system that does
    # not answer would otherwise keep it "working", a straggler for ever).
    from ddp_preflight.hangwatch.stalled import working
    pyspy = Path(__file__).parent / "artifacts" / "pyspy" / "importing_torch_dynamo.json"
    header, watcher, events = replay("sleep", tmp_path, until=5.0)
    t = next(iter(watcher.state.live()))
    t.dump, t.view.cpu, t.idle_since, t.io_known, t.moved = json.loads(pyspy.read_text()), 0.0, 1.0, True, 0
    e = evidence_of(watcher.state, t, 10.0)
    assert (e.state, e.op, e.reason, working(e)) == (S.IMPORTING, "torch._dynamo", Reason.WAITS_ON_IO, False)
    t.moved = 4096                                    # still reading its files
    e = evidence_of(watcher.state, t, 10.0)
    assert (e.state, e.reason, working(e)) == (S.IMPORTING, None, True)


def test_cpu_counted_in_a_sample_that_began_before_its_stack_came_is_not_work_since_that_stack(tmp_path):
    # A rank its stack shows waiting in all_reduce, then a sample with CPU that came after the stack
    # was asked for but began before the stack came (its last compute before the wait, or our py-spy
    # stopping and releasing it): it still waits there, not "computing at no known line" (a loaded
    # full run named it beside the rank that computed for ever). CPU in a sample begun after: it works.
    header, watcher, events = replay("sleep", tmp_path, until=30.0)
    t = next(t for t in watcher.state.live() if t.dump is not None
             and classify(t.dump, 0.0, t.view.wchan).state is S.COLLECTIVE)
    interval = watcher.state.config.interval
    t.idle_since, t.view.cpu, t.withheld = None, 40.0, None
    t.stack_at, t.read_at = 20.0, 20.0 + interval / 2
    t.busy_at = 20.0 + interval          # its window began before the stack came
    e = evidence_of(watcher.state, t, 21.0)
    assert (e.state, e.op) == (S.COLLECTIVE, "all_reduce"), e
    t.busy_at = 20.0 + interval * 1.5 + 0.01    # a whole sample after the stack came
    e = evidence_of(watcher.state, t, 22.0)
    assert (e.state, e.frame, e.notes[-1]) == (S.COMPUTING, None, "working since its last stack"), e
