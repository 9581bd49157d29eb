"""Who failed first is decided once (hangwatch/exits.py's judge) and the live watcher, a launch's
summary and `ddp-preflight explain` all say the same of the same evidence: each recorded run's
ranks' output lines and exits (tests/unit/artifacts/logs/, read by explain's one reader of those
files), and the agents' messages of real lab runs (tests/unit/artifacts/agent/) replayed through
the real Watcher. A run launched by ddp-preflight keeps its verdict in result.json, and explain
of its folder reports that verdict, not another one decided from the files."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from ddp_preflight.explain import explain, inputs
from ddp_preflight.explain.gather import gather
from ddp_preflight.explain.render import as_json
from ddp_preflight.explain.verdict import decide
from ddp_preflight.hangwatch.events import Event, EventKind
from ddp_preflight.hangwatch.model import Certainty, Diagnosis, Kind, Reason
from ddp_preflight.hangwatch.text import headline
from ddp_preflight.hangwatch.watch import Watcher, WatchTarget
from ddp_preflight.launch.ends import judged
from ddp_preflight.launch.outcome import LaunchedRank, LaunchResult, NodeState, Why, render
from ddp_preflight.launch.outcome import explain as attribute
from ddp_preflight.launch.watched import RunVerdict
from ddp_preflight.node.protocol import ExitStatus
from ddp_preflight.transport import LocalNode

from .test_hangwatch_watch import replay

ROOT = Path(__file__).parents[2]
ART = Path(__file__).parent / "artifacts"
LOGS, CORPUS, PASTED = ART / "logs", ART / "explain", ART / "pasted"


def said(d: Diagnosis | None):
    return None if d is None else (d.kind, tuple(d.culprits), tuple(d.candidates), d.reason)


def _live(g, tmp_path, planned: dict[int, str] | None = None) -> Diagnosis | None:
    """What the live watcher says when a launcher tells it each rank's exit (torchrun's word) and
    the exception its output shows: Watcher.rank_ended and rank_error, as a watched launch does
    (`planned`: the launch plan's rank -> node, which a watched launch gives its watcher)."""
    watcher = Watcher([WatchTarget(LocalNode(n, "python")) for n in ("master", "worker1")], clock=lambda: 0.0,
                      wall=lambda: 1.0, incident_dir=str(tmp_path), planned=planned)
    for seen in g.ranks:
        if seen.rank is not None and seen.exit is not None:
            watcher.rank_ended(seen.node, seen.rank, seen.pid, seen.exit)
    for seen in g.ranks:
        if seen.rank is not None and seen.exception is not None:
            watcher.rank_error(seen.node, seen.rank, seen.exception)
    return watcher.verdict()


def _launched(g, first_failure: str) -> LaunchResult:
    """The same ends as a launch's result, without hangwatch's verdict: each rank's exit code or
    signal and the exception its output shows; every node's torchrun failed."""
    ranks = [LaunchedRank(s.rank, s.node, s.local_rank if s.local_rank is not None else s.rank % 2, pid=s.pid,
                          exit=s.exit.code if s.exit else None, signal=s.exit.signal if s.exit else None,
                          error=s.exception)
             for s in sorted(g.ranks, key=lambda s: s.rank)]
    nodes = [NodeState(n, "failed", exit=1, launched=True, watched=True) for n in ("master", "worker1")]
    for node in nodes:
        attribute([r for r in ranks if r.node == node.node], node)
    return LaunchResult(ranks, nodes, f"{first_failure} failed", first_failure, 10.0)


# Recorded runs whose every rank's end the files show (a rank that exits 0 is in no table: quit's
# rank 1 is then seen by the watcher and not by the logs, and is left out here).
RECORDED = {
    "raise": (Kind.EXITED, (1,), (), Reason.RAISED),
    "chained": (Kind.EXITED, (1,), (), Reason.RAISED),
    "exit": (Kind.EXITED, (3,), (), Reason.EXIT_CODE),
    "sigkill": (Kind.EXITED, (3,), (), Reason.KILLED),
    "exit-abort": (Kind.EXITED, (3,), (), Reason.RAISED),
    "quit-abort": (Kind.EXITED, (3,), (), Reason.RAISED),
}


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_the_watcher_the_launch_summary_and_explain_name_the_same_first_failure(name, tmp_path):
    g = gather(inputs.find([str(LOGS / name)]))
    from_files = decide(g).diagnosis
    live = _live(g, tmp_path)
    # The node listed first is not the one that failed first: no rank is named by list order.
    for first_failure in ("master", "worker1"):
        result = _launched(g, first_failure)
        from_launch = judged(result)
        assert said(from_launch) == said(live) == said(from_files) == RECORDED[name], (name, first_failure)
        assert render(result, 29500, "master").splitlines()[0].startswith(f"training failed: {headline(live)}")


def test_the_rank_torchrun_stopped_the_others_for_is_the_rules_not_the_lists_first(tmp_path):
    # Rank 2 lost its peer and rank 3 raised on one node (the raise run's worker1, as a launch of
    # 3 ranks per node would see it): torchrun stopped rank 4 for rank 3's failure.
    g = gather(inputs.find([str(LOGS / "raise")]))
    lost, own = (next(s for s in g.ranks if s.rank == r) for r in (2, 1))
    ranks = [LaunchedRank(2, "worker1", 0, pid=1, exit=1, error=lost.exception),
             LaunchedRank(3, "worker1", 1, pid=2, exit=1, error=own.exception),
             LaunchedRank(4, "worker1", 2, pid=3, signal=15, stopped_by="torchrun")]
    attribute(ranks, NodeState("worker1", "failed", exit=1, launched=True, watched=True))
    assert ranks[2].why is Why.STOPPED_BY_TORCHRUN and ranks[2].why_text() == "stopped by torchrun when rank 3 failed"


def test_a_launched_runs_folder_gives_the_verdict_its_result_json_saved():
    # A real --launch (launch-raise): the verdict hangwatch decided live is in result.json, with
    # what only the live run saw: each rank's pid and when it ended, on one clock.
    folder = LOGS / "launch-raise"
    saved = Diagnosis.from_json(json.loads((folder / "result.json").read_text())["verdict"])
    e = explain([str(folder)])
    d = e.diagnosis
    assert e.saved and d is not None
    assert said(d) == said(saved) == (Kind.EXITED, (3,), (), Reason.RAISED) and d.certainty is Certainty.CERTAIN
    assert [(ev.rank, ev.pid, ev.ended_at, ev.reason) for ev in d.evidence] == \
        [(ev.rank, ev.pid, ev.ended_at, ev.reason) for ev in saved.evidence]
    assert str(e.quotes[0]) == f"{folder / 'worker1.log'}:17: [worker1 r3] [rank3]: RuntimeError: bad batch at step 5"


def test_explain_reports_the_saved_hang_not_the_one_the_files_alone_would_name(tmp_path):
    # The launch-leave run (real, recorded): its files alone say rank 2 is behind (Flight
    # Recorder). The live watcher named rank 2 as having left the loop (its stack: idle at its own
    # line), kept in the run's incident bundle; every rank ended by ddp-preflight's stop
    # (--stop-on-hang), so nothing failed on its own: the run's verdict is that hang, and a
    # launch saves it in result.json (launch.watched.RunVerdict).
    run = tmp_path / "run"
    shutil.copytree(CORPUS / "launch-leave", run)
    bundle = json.loads(next(run.glob("incidents/*/incident.json")).read_text())
    named = Diagnosis.from_json(bundle["snapshot"]["diagnosis"])
    verdicts = RunVerdict()
    verdicts.heard(Event(EventKind.DIAGNOSIS, verdict=named))
    result = json.loads((run / "result.json").read_text())
    assert result["verdict"] is None                  # recorded before launches saved the hang
    result["verdict"] = verdicts.of(_result_of(result), ended=None).to_json()
    (run / "result.json").write_text(json.dumps(result))
    files_alone = explain([str(CORPUS / "launch-leave")]).diagnosis
    assert files_alone is not None and files_alone.reason is Reason.BEHIND
    e = explain([str(run)])
    assert e.saved and e.diagnosis is not None
    assert said(e.diagnosis) == (Kind.DEADLOCK, (2,), (), Reason.LEFT_LOOP) == said(named)


def _result_of(data: dict) -> LaunchResult:
    ranks = [LaunchedRank(r["rank"], r["node"], r["local_rank"], pid=r["pid"], exit=r["exit"], signal=r["signal"])
             for r in data["ranks"]]
    return LaunchResult(ranks, [NodeState(n["node"], n["status"], stopped=n["stopped"]) for n in data["nodes"]],
                        data["stop_reason"], data["first_failure"], data["seconds"])


def test_a_replayed_lab_run_says_the_same_live_in_its_launch_summary_and_in_explain(tmp_path):
    # Real agents' messages (a rank raised; the kernel's TIME_WAIT says it closed first) through
    # the real Watcher: its verdict is the run's; the launch's summary says it and saves it; explain
    # of the folder says it again.
    header, watcher, events = replay("raise", tmp_path)
    live = watcher.verdict()
    assert live is not None and said(live) == (Kind.EXITED, (header["rank"],), (), Reason.FAILED)
    snapshot = watcher.snapshot()
    ranks = [LaunchedRank(v.rank, v.node, v.local_rank, pid=v.pid, exit=v.exit.code if v.exit else None,
                          signal=v.exit.signal if v.exit else None) for v in snapshot.ranks if v.rank is not None]
    result = LaunchResult(ranks, [NodeState("master", "failed", exit=1), NodeState("worker1", "failed", exit=1)],
                          "master failed", "master", 20.0)
    verdicts = RunVerdict()
    for event in events:
        verdicts.heard(event)
    result.verdict, result.judged = verdicts.of(result, live), True
    assert render(result, 29500, "master").splitlines()[0].startswith(f"training failed: {headline(live)}")
    run = tmp_path / "run"
    run.mkdir()
    (run / "result.json").write_text(json.dumps(result.to_json()))
    e = explain([str(run)])
    assert e.saved and said(e.diagnosis) == said(live)


def test_a_replayed_hang_is_the_runs_verdict_when_nothing_failed_on_its_own(tmp_path):
    # A rank held by SIGSTOP (real agents' messages): hangwatch names it; ddp-preflight stops
    # every rank (--stop-on-hang). The run's verdict, saved and explained, is that hang.
    header, watcher, events = replay("stop", tmp_path)
    verdicts = RunVerdict()
    for event in events:
        verdicts.heard(event)
    ranks = [LaunchedRank(v.rank, v.node, v.local_rank, pid=v.pid, signal=15, why=Why.STOPPED_BY_US)
             for v in watcher.snapshot().ranks if v.rank is not None]
    result = LaunchResult(ranks, [NodeState(n, "stopped", stopped=True) for n in ("master", "worker1")],
                          "hangwatch named a hang (--stop-on-hang)", None, 20.0)
    verdict = verdicts.of(result, None)
    assert verdict is not None and said(verdict) == (Kind.DEADLOCK, (header["rank"],), (), Reason.STOPPED)
    result.verdict, result.judged = verdict, True
    summary = render(result, 29500, "master").splitlines()
    assert summary[:2] == ["training stopped (hangwatch named a hang (--stop-on-hang)): every node was stopped",
                           f"  the hang: {headline(verdict)}"]
    run = tmp_path / "run"
    run.mkdir()
    (run / "result.json").write_text(json.dumps(result.to_json()))
    assert said(explain([str(run)]).diagnosis) == said(verdict)
    # Progress resumed after it: the hang no longer stands, and a run stopped after that has none.
    verdicts.heard(Event(EventKind.RESUMED))
    assert verdicts.of(result, None) is None


def _recorded_inputs() -> list[Path]:
    return [*sorted(p for p in LOGS.iterdir() if p.is_dir()), *sorted(p for p in CORPUS.iterdir() if p.is_dir()),
            *sorted(PASTED.glob("*.log"))]


def test_no_placeholder_rank_reaches_explains_json():
    # A writer whose rank the input never says (a pasted traceback) is named by where it wrote,
    # never "rank 1000000000" (and never a negated pid).
    unnumbered = 0
    for path in _recorded_inputs():
        text = as_json(explain([str(path)]))
        assert "1000000000" not in text, path
        d = json.loads(text)["diagnosis"]
        for who in (d or {}).get("culprits", []) + (d or {}).get("candidates", []):
            assert isinstance(who, dict) or who >= 0, (path, who)
            unnumbered += isinstance(who, dict)
    assert unnumbered >= 5          # the corpus holds such pastes: the test saw them


def test_exits_are_read_once_and_the_stopping_signals_listed_once():
    # An exit is typed where it is read (node.protocol.ExitStatus); no module matches an exit's
    # words back into numbers, or keeps its own list of the signals a launcher stops ranks with.
    said_back = re.compile(r"""startswith\(["'](exit code|signal )|re\.compile\(r?["']signal \(|== ["']signal \d""")
    own_list = re.compile(r"\(15, 2, 1\)|STOPPING_SIGNALS")
    broken = []
    for package in ("ddp_preflight/hangwatch", "ddp_preflight/explain", "ddp_preflight/launch", "ddp_preflight/tui", "ddp_preflight/cli"):  # noqa: E501
        for path in sorted((ROOT / package).rglob("*.py")):
            source = path.read_text()
            rel = path.relative_to(ROOT).as_posix()
            broken += [f"{rel}: parses an exit back from text" for _ in said_back.finditer(source)]
            broken += [f"{rel}: its own list of the stopping signals" for _ in own_list.finditer(source)]
    assert not broken, "\n".join(broken)


def test_torchruns_failed_line_gives_the_ranks_exit_where_no_table_follows(tmp_path):
    # The top of a node's log as users paste it, up to torchrun's own "failed (exitcode: 3)
    # local_rank: 1 (pid: ...)" line, without the ChildFailedError table after it: the line alone
    # says how rank 3 ended (read into an ExitStatus where it is read, once).
    lines = (LOGS / "exit" / "worker1.log").read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if "failed (exitcode: 3)" in line)
    head = tmp_path / "worker1.log"
    head.write_text("".join(lines[:cut + 1]))
    e = explain([str(head)])
    assert said(e.diagnosis) == (Kind.EXITED, (3,), (), Reason.EXIT_CODE)
    rank3 = next(ev for ev in e.diagnosis.evidence if ev.rank == 3)
    assert (rank3.exit, rank3.pid) == (ExitStatus(code=3), 25057)
    assert rank3.quote == f"{head}:{cut + 1}: {lines[cut].strip()}"
