"""Lines from the nodes: which rank wrote them, the log files, and how each rank's end is told."""

from __future__ import annotations

import signal
import subprocess
import sys

from ddp_preflight.launch.outcome import LaunchedRank, LaunchResult, NodeState, explain, render
from ddp_preflight.launch.output import NodeLogs, parse


def test_torchruns_tee_prefix_gives_the_global_rank():
    line = parse("worker1", 2, "[default1]:step 5 loss 2.0", 10.0)
    assert (line.node, line.rank, line.local_rank, line.text) == ("worker1", 3, 1, "step 5 loss 2.0")
    assert line.prefixed() == "[worker1 r3] step 5 loss 2.0" and line.step == 5


def test_a_ranks_escape_sequences_reach_the_terminal_shown_and_the_log_raw():
    line = parse("worker1", 2, "[default1]:\x1b]0;owned\x07\x1b[2Jstep 5\tloss 2.0", 10.0)
    assert line.shown() == "[worker1 r3] ^[]0;owned^G^[[2Jstep 5\tloss 2.0"
    assert line.prefixed() == "[worker1 r3] \x1b]0;owned\x07\x1b[2Jstep 5\tloss 2.0"      # what the log keeps


def test_torchruns_own_lines_belong_to_the_node():
    line = parse("master", 0, "W1121 torch/distributed/elastic/api.py: Sending process 7 closing signal SIGTERM", 1.0)
    assert line.rank is None and line.prefixed().startswith("[master] W1121") and line.step is None


def test_steps_are_read_from_step_lines_only():
    assert parse("m", 0, "[default0]:step 00004/05000 (0.08%) | loss: 10.39", 0).step == 4
    assert parse("m", 0, "[default0]:Step: 12 loss 1", 0).step == 12
    assert parse("m", 0, "[default0]:rank 3 exits at step 5", 0).step is None
    assert parse("m", 0, "[default0]:stepping up", 0).step is None


def test_a_log_file_per_node(tmp_path):
    logs = NodeLogs(tmp_path / "run")
    logs.write("master", "[master r0] step 0")
    logs.write("worker1", "[worker1 r1] step 0")
    logs.write("master", "[master r0] step 1")
    logs.close()
    assert (tmp_path / "run" / "master.log").read_text() == "[master r0] step 0\n[master r0] step 1\n"
    assert (tmp_path / "run" / "worker1.log").read_text() == "[worker1 r1] step 0\n"


def ranks_of(node, *outcomes):
    out = []
    for local, (exit, sig) in enumerate(outcomes):
        out.append(LaunchedRank(local, node, local, pid=100 + local, exit=exit, signal=sig))
    return out


def test_a_failed_rank_and_the_ranks_torchrun_stopped_for_it():
    ranks = ranks_of("worker1", (None, signal.SIGTERM), (3, None))
    explain(ranks, NodeState("worker1", status="failed", exit=1, launched=True, watched=True))
    assert ranks[1].outcome() == "exit code 3" and ranks[1].why is None
    assert ranks[0].outcome() == "signal 15 (SIGTERM), stopped by torchrun when rank 1 failed"


def test_ranks_of_a_node_ddp_preflight_stopped():
    ranks = ranks_of("master", (None, signal.SIGTERM), (None, signal.SIGKILL))
    explain(ranks, NodeState("master", status="stopped", stopped=True, launched=True, watched=True))
    assert [r.outcome() for r in ranks] == ["signal 15 (SIGTERM), stopped by ddp-preflight",
                                            "signal 9 (SIGKILL), stopped by ddp-preflight"]


def test_a_rank_killed_by_a_signal_of_its_own_is_the_failure_not_a_victim():
    ranks = ranks_of("worker1", (None, signal.SIGKILL), (None, signal.SIGTERM))   # e.g. the OOM killer
    explain(ranks, NodeState("worker1", status="failed", exit=1, launched=True, watched=True))
    assert ranks[0].why is None and "stopped by torchrun when rank 0 failed" in ranks[1].outcome()


def test_the_summary_names_the_first_failure_and_every_rank():
    worker = ranks_of("worker1", (None, signal.SIGTERM), (3, None))
    for r, rank in zip(worker, (2, 3), strict=True):
        r.rank = rank
    master = ranks_of("master", (None, signal.SIGTERM), (None, signal.SIGTERM))
    nodes = [NodeState("master", status="stopped", stopped=True, launched=True, watched=True),
             NodeState("worker1", status="failed", exit=1, launched=True, watched=True)]
    explain(master, nodes[0])
    explain(worker, nodes[1])
    result = LaunchResult(master + worker, nodes, "worker1 failed", "worker1", 12.0, "runs/x", port_free=True)
    text = render(result, 29500, "master")
    assert text.splitlines()[0] == "training failed: rank 3 on worker1 ended with exit code 3; every node was stopped"
    assert "  rank 0 on master: signal 15 (SIGTERM), stopped by ddp-preflight" in text
    assert "  rank 3 on worker1: exit code 3" in text and "port 29500 on master is free again" in text
    assert result.exit_code == 1 and result.to_json()["ranks"][3]["outcome"] == "exit code 3"


def test_all_ranks_exiting_zero_is_success():
    ranks = ranks_of("master", (0, None), (0, None))
    result = LaunchResult(ranks, [NodeState("master", status="exited", exit=0)], None, None, 3.0)
    assert result.ok and result.exit_code == 0
    assert render(result, 29500, "master").startswith("training finished: all 2 ranks exited with code 0")


def test_the_launch_package_stays_headless():
    # The dashboard imports the launcher; the launcher never imports textual (STYLE: harlequin).
    code = "import sys, ddp_preflight.launch, ddp_preflight.cli.launch; print('textual' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_the_headline_is_hangwatchs_verdict_when_it_names_a_rank():
    # Rank 1 raised (its own record); torchrun stopped rank 0 beside it; worker1's ranks lost it.
    from ddp_preflight.hangwatch.exits import Ending, judge
    from ddp_preflight.node.protocol import ExitStatus
    raised = {"how": "raised", "t": 9.2, "type": "RuntimeError", "message": "bad batch at step 5",
              "frames": [{"file": "/work/train.py", "line": 172, "function": "main"}]}
    verdict = judge([Ending("master", 101, 1, 9.2, 0.001, ExitStatus(code=1), raised, launcher=90),
                     Ending("master", 100, 0, 9.3, 0.001, ExitStatus(signal=15), stopped_by="torchrun", launcher=90),
                     Ending("worker1", 102, 2, 9.8, 0.001, ExitStatus(code=1), launcher=91),
                     Ending("worker1", 103, 3, 9.9, 0.001, ExitStatus(signal=15), stopped_by="ddp-preflight",
                            launcher=91)])
    assert verdict is not None and (verdict.culprits, verdict.reason, verdict.certainty) == ((1,), "raised", "certain")
    master = ranks_of("master", (None, signal.SIGTERM), (1, None))
    worker = ranks_of("worker1", (1, None), (None, signal.SIGTERM))
    for r, rank in zip(worker, (2, 3), strict=True):
        r.rank = rank
    nodes = [NodeState("master", status="failed", exit=1, launched=True, watched=True),
             NodeState("worker1", status="stopped", stopped=True, launched=True, watched=True)]
    explain(master, nodes[0])
    explain(worker, nodes[1])
    result = LaunchResult(master + worker, nodes, "master failed", "master", 12.0, "runs/x", verdict=verdict)
    text = render(result, 29500, "master")
    assert text.splitlines()[0] == ("training failed: rank 1 on master raised RuntimeError: bad batch at step 5 at "
                                    "train.py:172; every node was stopped")
    assert result.to_json()["verdict"]["culprits"] == [1] and result.to_json()["verdict"]["reason"] == "raised"


# As a rank on master printed it under load, when ddp-preflight's stop reached worker1 first (make test, lab).
LOST_PEER = """[rank1]: Traceback (most recent call last):
[rank1]:   File "/tmp/cleanclone/examples/hang_train.py", line 206, in main
[rank1]:     loss = train_step(model, optimizer, next(data))
[rank1]:   File "/tmp/cleanclone/examples/hang_train.py", line 140, in train_step
[rank1]:     loss.backward()
[rank1]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.213.1.11]:2478.
"""


def _lost_peer():
    from ddp_preflight.hangwatch.tracebacks import Reader
    reader, seen = Reader(), None
    for line in LOST_PEER.splitlines():
        seen = reader.feed(line) or seen
    return seen


def test_a_lost_peer_after_ddp_preflights_own_stop_is_the_stops_victim_and_before_it_a_failure():
    error = _lost_peer()
    assert error is not None and error.lost_peer
    after, before = ranks_of("master", (1, None), (1, None))
    after.error, after.error_after_stop = error, True
    before.error, before.error_after_stop = error, False
    explain([after, before], NodeState("master", status="stopped", stopped=True, launched=True, watched=True))
    assert after.outcome() == "exit code 1, lost its peer when ddp-preflight stopped the run"
    assert before.why is None and before.outcome() == "exit code 1"
    result = LaunchResult([after], [NodeState("master", status="stopped", stopped=True)],
                          "quit from the dashboard", None, 1.0)
    assert result.failed_ranks() == []
    assert render(result, 29500, "master").splitlines()[0] == \
        "training stopped (quit from the dashboard): every node was stopped"
