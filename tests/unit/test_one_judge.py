"""One judge for every mode (issue 35): every recorded run folder in tests/unit/artifacts, read by
explain's one reader of those files, is judged twice: by explain, and by the live watcher fed the
same ends as a watched launch feeds it (each rank's exit from torchrun and the exception its output
shows: Watcher.rank_ended and rank_error; its plan, rank -> node). Both call the one judge of a run's ends
(hangwatch/named.py: what the ranks' failure words name, then hangwatch/exits.py's who failed
first), so they give the same verdict (kind, culprits, certainty), or this file names what one of
them read that the other was not given. "Live" is what a watched launch concludes: hangwatch's
verdict, else what the torchruns' own lines named (launch/watched.py). Before this change they
disagreed on 13 of the 28 (kind, culprits, certainty or reason); then on 4; now on none."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_preflight.explain import inputs
from ddp_preflight.explain.gather import gather
from ddp_preflight.explain.verdict import decide
from ddp_preflight.hangwatch.model import Certainty, Diagnosis, Kind, Reason

from .test_first_failure import _live

ART = Path(__file__).parent / "artifacts"
FOLDERS = sorted(p.parent.relative_to(ART).as_posix() for p in ART.glob("*/*/run.json"))


def verdict(d: Diagnosis | None):
    return None if d is None else (d.kind, tuple(d.culprits), d.certainty)


# Before: 4 folders were named here as disagreeing. quit, quit-r3 and quit-work: a rank that exits 0
# is in no torchrun table; explain took it as the peer the others lost, the live judge was given no
# such rank. A watched launch has its plan (rank -> node), and the live judge now takes the planned
# ranks nothing shows as explain takes the ranks in no table (hangwatch/ended.unseen). launch-leave:
# its watcher named the hang from stacks and Flight Recorders, which the replay of ends cannot
# rebuild; its verdict is the one the watcher kept in its bundle.


def test_every_recorded_run_folder_is_judged_here():
    # 29 folders with a run.json (nccl-h100 holds loose logs, no run): a folder added is judged too.
    assert len(FOLDERS) == 29, FOLDERS


def _watched_launch(g, tmp_path) -> Diagnosis | None:
    """What a watched launch concludes (launch/watched.py's WatchedLaunch.verdict): hangwatch's
    verdict on the ends it was fed, else, where it followed no rank, what the torchruns' own lines
    named (launch/ends.by_launchers over what the launcher read of each node's own lines)."""
    from ddp_preflight.launch.ends import by_launchers
    from ddp_preflight.launch.outcome import NodeState
    nodes = {}
    for n in g.nodes:
        if n.node is not None:
            nodes.setdefault(n.node, NodeState(n.node)).said.append(n.said)
    kept = _said_live(g)
    if kept is not None:
        return kept
    planned = {s.rank: s.node for s in g.ranks if s.rank is not None and s.node is not None}
    return _live(g, tmp_path, planned) or by_launchers(list(nodes.values()))


def _said_live(g) -> Diagnosis | None:
    """The hang a watched launch's watcher said, from stacks and Flight Recorders the files do not
    replay: the verdict of the first bundle it wrote (incidents/*/incident.json)."""
    import json
    folders = {Path(p).parent for p in g.read}
    bundles = sorted(b for f in folders for b in f.glob("incidents/*/incident.json"))
    if not bundles:
        return None
    return Diagnosis.from_json(json.loads(bundles[0].read_text())["snapshot"]["diagnosis"])


@pytest.mark.parametrize("folder", FOLDERS)
def test_live_and_explain_give_one_verdict_on_a_recorded_run(folder, tmp_path):
    g = gather(inputs.find([str(ART / folder)]))
    from_files = verdict(decide(g).diagnosis)
    live = verdict(_watched_launch(g, tmp_path))
    assert live == from_files, folder


@pytest.mark.parametrize("folder, reason, culprits", [
    ("logs/vpn-ipv6", Reason.ADDRESS_FAMILY, (2, 3)),          # seed 004: Gloo binds IPv6 on worker1
    ("logs/firewall", Reason.CANNOT_CONNECT, ()),              # connectFullMesh: a node's rule, no rank
    ("explain/refused", Reason.CANNOT_CONNECT, ()),
    ("explain/getfuture", Reason.UNSUPPORTED, (0, 1, 2, 3)),   # Gloo lacks Work::getFuture
    ("logs/timeout", Reason.BEHIND, (1,)),                     # the others timed out waiting for rank 1
    ("explain/large-timeout", Reason.TIMED_OUT, (0, 1, 2, 3)),
])
def test_the_live_watcher_names_what_the_failures_words_name(folder, reason, culprits, tmp_path):
    # Before: live said "raised" / "lost-peer" on these while explain named the cause (the message-
    # text diagnoses lived in explain/words.py alone).
    g = gather(inputs.find([str(ART / folder)]))
    live = _live(g, tmp_path)
    assert live is not None and (live.reason, tuple(live.culprits)) == (reason, culprits)
    d = decide(g).diagnosis
    assert d is not None and (d.reason, tuple(d.culprits)) == (reason, culprits)


PASTED = sorted((ART / "pasted").glob("*.log"))


@pytest.mark.parametrize("path", [ART / f for f in FOLDERS] + PASTED, ids=lambda p: p.name)
def test_explain_names_one_culprit_list(path):
    # Before: beside "rank 3 was killed" (the verdict), the finding of sigkill-reset named rank 1 (its
    # table's first failed line: local rank 1 on worker1 read as global rank 1); exit-abort's named
    # rank 0 beside the verdict's rank 3; quit-r3's rank 0 beside rank 3.
    from ddp_preflight.explain import explain
    e = explain([str(path)])
    for run in e.runs or (e,):
        d, f = run.diagnosis, run.finding
        if d is not None and d.culprits and f is not None:
            assert set(f.culprits) <= set(d.culprits), (d.culprits, f.culprits)


def test_explain_reads_an_empty_flight_recorder_the_launch_kept(tmp_path):
    # A rank that ran no collective dumps its recorder with `"pg_status": {}` and no "entries" (torch
    # omits an empty list). Before: "a JSON document of another kind", not read. Derived from the
    # launch's own kept dump of launch-leave (flight-rank-3.json), its entries and status emptied.
    import json
    import shutil

    from ddp_preflight.explain import explain
    folder = tmp_path / "launch-leave"
    shutil.copytree(ART / "explain" / "launch-leave", folder)
    kept = json.loads((folder / "flight-rank-3.json").read_text())
    kept["flight"] = {k: v for k, v in kept["flight"].items() if k != "entries"} | {"pg_status": {}}
    (folder / "flight-rank-3.json").write_text(json.dumps(kept))
    e = explain([str(folder)])
    assert str(folder / "flight-rank-3.json") in e.read
    assert not [s for s in e.skipped if "flight-rank-3" in s]
    d = e.diagnosis
    assert d is not None and (d.kind, tuple(d.culprits)) == (Kind.DEADLOCK, (2,))   # the others' dumps still decide


def test_a_watched_launch_stopped_with_no_hang_named_is_not_a_deadlock_in_explain(tmp_path):
    # nanochat and nanoGPT, stopped by a person (SIGTERM or Ctrl-C to the launcher) while healthy:
    # explain of the folder said "deadlock (certain): rank 1 never entered all_gather #152" from the
    # Flight Recorders the launch kept at the stop (ranks one collective apart: a run in flight). The
    # watcher, which saw their progress, named no hang: no verdict in result.json, no incident bundle.
    # Derived from launch-leave (real): the same folder without the bundle hangwatch wrote is a
    # watched launch stopped with no hang named.
    import json
    import shutil

    from ddp_preflight.explain import explain
    from ddp_preflight.explain.render import as_text
    folder = tmp_path / "stopped"
    shutil.copytree(ART / "explain" / "launch-leave", folder, ignore=shutil.ignore_patterns("incidents"))
    result = json.loads((folder / "result.json").read_text())
    (folder / "result.json").write_text(json.dumps({**result, "stop_reason": "interrupted"}))    # Ctrl-C's
    e = explain([str(folder)])
    assert e.diagnosis is None and e.stopped == "interrupted"
    assert "the launch was stopped (interrupted) while hangwatch watched it, and it named no hang" in as_text(e)
    # With the bundle of the hang it named, the files still say what it was (launch-leave's verdict).
    d = explain([str(ART / "explain" / "launch-leave")]).diagnosis
    assert d is not None and (d.kind, tuple(d.culprits), d.certainty) == (Kind.DEADLOCK, (2,), Certainty.CERTAIN)


def test_nccls_watchdog_line_is_a_collectives_timeout_live_as_in_the_files(tmp_path):
    # The real H100 run (logs/nccl-h100/hung-train-tail.log): rank 0's NCCL watchdog caught its
    # all_reduce #65 past its 60 s timeout. Explain said network-stall (its own watchdog rule); the
    # live judge, fed the same words and the end NCCL's async error handling gives (SIGABRT), said
    # "exited, lost-peer": the watchdog's words were read by explain alone. Now both read them in the
    # one judge (named.said: the collective's timeout). (That run's rank hung on instead and was
    # killed: live, a rank still running is judged from its stacks.)
    import signal

    from ddp_preflight.node.protocol import ExitStatus
    g = gather(inputs.find([str(ART / "logs" / "nccl-h100" / "hung-train-tail.log")]))
    (rank0,) = g.ranks
    rank0.exit, rank0.node, rank0.pid = ExitStatus(signal=signal.SIGABRT), "master", 763
    from_files, live = verdict(decide(g).diagnosis), verdict(_live(g, tmp_path))
    assert live == from_files == (Kind.NETWORK_STALL, (0,), Certainty.LIKELY)
    assert _live(g, tmp_path).reason is Reason.TIMED_OUT
