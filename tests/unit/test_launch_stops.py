"""Who began stopping a launched rank is one rule (hangwatch/exits.py's stop_of) for the launch's
summary (launch/ends.py, launch/outcome.py) and explain of its result.json (explain/records.py),
and a rank that ended by itself before any stop is never put on its launcher: a rank SIGKILLed from
outside, a rank that aborted on Gloo's size mismatch (issue 35's cases, on the recorded runs'
own ranks' output: tests/unit/artifacts/logs/sigkill and size)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from ddp_preflight.explain import explain, inputs
from ddp_preflight.explain.gather import gather
from ddp_preflight.explain.verdict import decide
from ddp_preflight.hangwatch.exits import OUTSIDE, StoppedBy, stop_of
from ddp_preflight.hangwatch.model import Certainty, Kind, Reason
from ddp_preflight.hangwatch.text import headline
from ddp_preflight.launch.ends import judged
from ddp_preflight.launch.outcome import STOPPED_BY_US, LaunchedRank, LaunchResult, NodeState, render
from ddp_preflight.launch.outcome import explain as attribute
from ddp_preflight.node.protocol import ExitStatus

from .test_first_failure import _live

LOGS = Path(__file__).parent / "artifacts" / "logs"


def test_the_stop_rule_reads_the_signal_and_who_saw_the_end_first():
    kill, term, abort = (ExitStatus(signal=s) for s in (signal.SIGKILL, signal.SIGTERM, signal.SIGABRT))
    assert stop_of(term, node_stopped=True) is OUTSIDE
    assert stop_of(kill, node_stopped=True) is OUTSIDE
    assert stop_of(abort, node_stopped=True) is None                 # no launcher sends SIGABRT
    assert stop_of(abort, node_stopped=True, torchrun=True) is StoppedBy.TORCHRUN
    assert stop_of(kill, node_stopped=True, failed_first=True) is None      # ended before any stop reached it
    assert stop_of(ExitStatus(code=1), node_stopped=True, error_after_stop=True) is OUTSIDE
    assert stop_of(term, node_stopped=False, torchrun=True) is StoppedBy.TORCHRUN


def _ranks(name: str) -> dict:
    return {s.rank: s for s in gather(inputs.find([str(LOGS / name)])).ranks}


def _killed_from_outside() -> LaunchResult:
    """sigkill/'s run as a launch saw it: rank 3 SIGKILLed from outside; torchrun on worker1 listed it
    as failed when it began stopping rank 2; ddp-preflight then stopped both nodes; ranks 0,1 lost
    their peer (their own output's exceptions)."""
    seen = _ranks("sigkill")
    ranks = [LaunchedRank(0, "master", 0, pid=10, exit=1, error=seen[0].exception),
             LaunchedRank(1, "master", 1, pid=11, exit=1, error=seen[1].exception),
             LaunchedRank(2, "worker1", 0, pid=20, signal=int(signal.SIGTERM), stopped_by=StoppedBy.TORCHRUN),
             LaunchedRank(3, "worker1", 1, pid=21, signal=int(signal.SIGKILL), failed_first=True)]
    nodes = [NodeState(n, "stopped", exit=1, launched=True, watched=True, stopped=True) for n in ("master", "worker1")]
    for node in nodes:
        attribute([r for r in ranks if r.node == node.node], node)
    return LaunchResult(ranks, nodes, "worker1 failed", "worker1", 10.0, judged=False)


def test_a_rank_killed_from_outside_is_the_culprit_in_the_summary_and_in_explain_of_result_json(tmp_path):
    # Before: its end was put on ddp-preflight's stop ("signal 9, stopped by ddp-preflight"), and
    # result.json and explain said "rank 0 lost its peer ... no rank ended before it".
    result = _killed_from_outside()
    rank3 = result.ranks[3]
    assert rank3.why is None and rank3.outcome() == "signal 9 (SIGKILL)"
    d = judged(result)
    assert d is not None and (d.kind, tuple(d.culprits), d.reason, d.certainty) == \
        (Kind.EXITED, (3,), Reason.KILLED, Certainty.CERTAIN)
    assert render(result, 29500, "master").splitlines()[0] == f"training failed: {headline(d)}; every node was stopped"
    (tmp_path / "result.json").write_text(json.dumps(result.to_json()))
    e = explain([str(tmp_path / "result.json")])
    assert e.diagnosis is not None and (e.diagnosis.kind, tuple(e.diagnosis.culprits), e.diagnosis.reason) == \
        (Kind.EXITED, (3,), Reason.KILLED)


def test_a_size_mismatch_is_a_mismatch_live_in_explain_and_in_the_summary_and_rank_0_aborted_by_itself(tmp_path):
    # Gloo's own words in rank 0's output: "Received data size doesn't match expected size. Is there a
    # distributed collective mismatch in your code?". Before: "rank 0 ended first (signal 6, SIGABRT) ...
    # its own error or a lost peer", the summary said rank 0 was "stopped by ddp-preflight".
    g = gather(inputs.find([str(LOGS / "size")]))
    want = (Kind.MISMATCH, (), Reason.SIZE_MISMATCH, Certainty.CERTAIN)
    for d in (decide(g).diagnosis, _live(g, tmp_path)):
        assert d is not None and (d.kind, tuple(d.culprits), d.reason, d.certainty) == want
    seen = {s.rank: s for s in g.ranks}
    ranks = [LaunchedRank(0, "master", 0, pid=10, signal=int(signal.SIGABRT), error=seen[0].exception),
             LaunchedRank(1, "master", 1, pid=11, exit=1, error=seen[1].exception, stopped_by=StoppedBy.TORCHRUN),
             LaunchedRank(2, "worker1", 0, pid=20, exit=1, error=seen[2].exception),
             LaunchedRank(3, "worker1", 1, pid=21, exit=1, error=seen[3].exception)]
    nodes = [NodeState(n, "stopped", exit=1, launched=True, watched=True, stopped=True) for n in ("master", "worker1")]
    for node in nodes:
        attribute([r for r in ranks if r.node == node.node], node)
    assert ranks[0].why != STOPPED_BY_US and ranks[0].outcome() == "signal 6 (SIGABRT)"
    d = judged(LaunchResult(ranks, nodes, "master failed", "master", 10.0))
    assert d is not None and (d.kind, tuple(d.culprits), d.reason, d.certainty) == want
    assert "Gloo received more bytes than its collective expected (rank 0 aborted on it (4096 bytes vs 2048)" \
        in headline(d)


def test_a_stop_signal_on_a_stopped_node_stays_the_stops_even_when_torchrun_listed_it_failed():
    # ddp-preflight's supervisor ends the node's whole group: a SIGTERM torchrun saw before its own
    # close is still that stop's, never the rank's own failure.
    assert stop_of(ExitStatus(signal=signal.SIGTERM), node_stopped=True, failed_first=True) is OUTSIDE


def test_a_verdict_carries_only_the_preflight_findings_that_can_cause_it(tmp_path):
    # Before: every warning of the named ranks' nodes rode along ("preflight said of vm:
    # stale-processes ..." beside a rank that raised, or one that left its loop).
    from ddp_preflight.hangwatch.diagnose import decide
    from ddp_preflight.hangwatch.model import NodeNote
    from ddp_preflight.hangwatch.stalled import Stall
    from ddp_preflight.hangwatch.text import summary

    from .test_hangwatch_pipeline import LEFT, WAITING, seen
    notes = {"master": (NodeNote("master", "pid 4242 still holds port 29500", "stale-processes"),
                        NodeNote("master", "1 shard here, 4 on worker1", "data-shards"))}
    d = decide(Stall(seen({0: WAITING, 1: LEFT, 2: WAITING, 3: WAITING}), waited=9.0, notes=notes))
    assert (d.kind, tuple(d.culprits), d.reason) == (Kind.DEADLOCK, (1,), Reason.LEFT_LOOP)
    assert [(n.check, n.said) for n in d.notes] == [("data-shards", "1 shard here, 4 on worker1")]
    assert summary(d).endswith("; preflight said of master: data-shards: 1 shard here, 4 on worker1")
    # A rank that raised: neither finding can cause it; a busy master port: the stale process can.
    from ddp_preflight.hangwatch import notes as clues
    assert clues.related(notes, ["master"], Reason.RAISED) == ()
    assert clues.related(notes, ["master"], Reason.PORT_IN_USE) == (notes["master"][0],)


def test_a_launchs_summary_names_what_torchruns_own_lines_name_as_explain_does(tmp_path):
    # port-busy (real: torchrun on master could not listen on its store's port): before, the launch
    # summary said only "torchrun on master ended with exit code 1"; explain of the files named the
    # busy port. The launcher now reads the node's own lines into what they name (named.launcher_said,
    # as run.py does line by line) and the one judge decides from them (named.by_launchers).
    from ddp_preflight.hangwatch.named import launcher_said
    from ddp_preflight.hangwatch.tracebacks import Reader

    folder = Path(__file__).parent / "artifacts" / "explain" / "port-busy"
    reader, said = Reader(), []
    for line in (folder / "master.log").read_text().splitlines():
        found = launcher_said(reader.feed(line), line)
        if found is not None and found not in said:
            said.append(found)
    nodes = [NodeState("master", "failed", exit=1, launched=True, said=said),
             NodeState("worker1", "stopped", launched=True, stopped=True)]
    ranks = [LaunchedRank(r, "master" if r < 2 else "worker1", r % 2) for r in range(4)]
    for node in nodes:
        attribute([r for r in ranks if r.node == node.node], node)
    result = LaunchResult(ranks, nodes, "master failed", "master", 5.0)
    d = judged(result)
    files = explain([str(folder)]).diagnosis
    assert d is not None and files is not None
    assert (d.kind, d.reason, tuple(d.nodes), d.store) == (files.kind, files.reason, tuple(files.nodes), files.store) \
        == (Kind.EXITED, Reason.PORT_IN_USE, ("master",), d.store)
    assert render(result, 29500, "master").splitlines()[0] == f"training failed: {headline(d)}; every node was stopped"
    assert "could not listen on the master port" in headline(d)
