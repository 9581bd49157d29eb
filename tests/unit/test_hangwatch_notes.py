"""A verdict carries what preflight said of a node only where that finding bears on the verdict's
cause: said of a node the verdict names (its ranks' nodes, or the nodes it names itself: a busy
master port, a parser that took the script's options) and by a check whose finding can cause the
verdict's reason (issue 35: "preflight said of vm: stale-processes ..." rode on every verdict)."""

from __future__ import annotations

from ddp_preflight.hangwatch import notes as clues
from ddp_preflight.hangwatch.model import Certainty, Diagnosis, Kind, NodeNote, Reason

STALE = NodeNote("master", "pid 4242 still holds port 29500", "stale-processes")
SHARDS = NodeNote("master", "1 shard here, 4 on worker1", "data-shards")
WORKER_STALE = NodeNote("worker1", "pid 77 still holds port 29500", "stale-processes")
SAID = {"master": (STALE, SHARDS), "worker1": (WORKER_STALE,)}
NODE_OF = {0: "master", 1: "master", 2: "worker1", 3: "worker1"}


def test_a_verdict_that_names_a_node_gets_the_findings_of_that_node_that_can_cause_it():
    # The launcher's words: the store could not listen on master's port. No rank is named, the node is.
    busy = Diagnosis(Kind.EXITED, reason=Reason.PORT_IN_USE, certainty=Certainty.CERTAIN, nodes=("master",))
    assert clues.of_verdict(SAID, busy, NODE_OF) == (STALE,)
    # The same cause on worker1: worker1's finding, never master's.
    assert clues.of_verdict(SAID, Diagnosis(Kind.EXITED, reason=Reason.PORT_IN_USE, nodes=("worker1",)), NODE_OF) \
        == (WORKER_STALE,)


def test_a_verdict_never_gets_a_finding_of_another_node_or_of_another_cause():
    raised = Diagnosis(Kind.EXITED, culprits=(1,), reason=Reason.RAISED, certainty=Certainty.CERTAIN)
    assert clues.of_verdict(SAID, raised, NODE_OF) == ()
    left = Diagnosis(Kind.DEADLOCK, culprits=(1,), reason=Reason.LEFT_LOOP, certainty=Certainty.CERTAIN)
    assert clues.of_verdict(SAID, left, NODE_OF) == (SHARDS,)
    # Rank 3 left its loop: master's data shards are not its node's.
    assert clues.of_verdict(SAID, Diagnosis(Kind.DEADLOCK, culprits=(3,), reason=Reason.LEFT_LOOP), NODE_OF) == ()


def test_a_finding_given_as_its_words_is_read_by_its_check_and_one_naming_no_check_is_no_clue():
    # Before: a note given as words (no check) rode on every verdict: "nothing says it cannot".
    said = {"master": ("data-shards: 1 shard here, 4 on worker1", "something else entirely")}
    left = Diagnosis(Kind.DEADLOCK, culprits=(1,), reason=Reason.LEFT_LOOP)
    assert clues.of_verdict(said, left, NODE_OF) == (SHARDS,)
    assert clues.of_verdict(said, Diagnosis(Kind.EXITED, culprits=(1,), reason=Reason.RAISED), NODE_OF) == ()
