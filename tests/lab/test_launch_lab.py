"""`ddp-preflight --launch` on the lab: a real 2-node x 2-process DDP (Gloo) run over the lab's
sshd, its output back on the master, and every way it ends leaving no process on any node."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp_preflight.hangwatch.alone import ALONE_AFTER
from ddp_preflight.hangwatch.stall import DEFAULT_THRESHOLD

CLI = [sys.executable, "-m", "ddp_preflight"]
REPO = Path(__file__).parents[2]
TRAIN = REPO / "examples" / "train_ddp.py"
NODES = ("master", "worker1")
PORT_CHECK = ("import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
              "s.bind(('', 29500)); s.listen()")


def command(lab, tmp_path, *options, script_args=("--steps", "3"), nproc=2, script=TRAIN):
    return [*CLI, *NODES, "--ssh-config", str(lab.ssh_config), "--launch", "--nproc-per-node", str(nproc),
            "--log-dir", str(tmp_path / "run"), *options, "--", str(script), *script_args]


def launch(lab, tmp_path, *options, timeout=180, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(command(lab, tmp_path, *options, **kwargs), capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done


def said(done: subprocess.CompletedProcess) -> str:
    """What ddp-preflight itself said (its exit code and every line of its own, none of the ranks'
    output), whole: the reason a run failed, as a failing assert's message."""
    own = [line for line in done.stderr.splitlines() if not line.startswith("[")]
    return f"exit code {done.returncode}\n" + "\n".join(own)


def _line(script: Path, text: str) -> int:
    return next(i for i, line in enumerate(script.read_text().splitlines(), 1) if text in line)


def counts(lab) -> dict:
    """The processes on each node (their pids)."""
    return {node: frozenset(lab.processes(node)) for node in NODES}


def left_since(lab, before: dict, timeout: float = 10) -> dict:
    """The processes on each node that were not there `before`, once those that are exiting have
    gone (an ssh session's process ends a moment after its connection closes). A process of an
    earlier test that ends meanwhile is not the run's."""
    deadline = time.monotonic() + timeout
    while True:
        now = counts(lab)
        left = {node: sorted(now[node] - before[node]) for node in NODES if now[node] - before[node]}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def assert_nothing_left(lab, before: dict, timeout: float = 10) -> None:
    """No process of the run on any node (none that was not there before it), and the port is free."""
    assert left_since(lab, before, timeout) == {}, {n: lab.processes(n) for n in NODES}
    bind = lab.exec("master", [sys.executable, "-c", PORT_CHECK])
    assert bind.returncode == 0, f"port 29500 is still held on master: {bind.stderr[-500:]}"


def rank_lines(stdout: str) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for line in stdout.splitlines():
        for node in NODES:
            for rank in range(4):
                prefix = f"[{node} r{rank}] "
                if line.startswith(prefix):
                    out.setdefault(rank, []).append(line[len(prefix):])
    return out


def test_four_ranks_on_two_nodes_stream_prefixed_output_and_keep_a_log_per_node(clean_lab, tmp_path):
    before = counts(clean_lab)
    # The full preflight (probes included) first, then the training on the same connections.
    # --nproc-per-node after the script is the script's: torchrun must not take it (seed 000).
    done = launch(clean_lab, tmp_path, script_args=("--steps", "3", "--nproc-per-node", "7"))
    assert done.returncode == 0, said(done)
    lines = rank_lines(done.stdout)
    assert sorted(lines) == [0, 1, 2, 3]
    for rank, node in ((0, "master"), (1, "master"), (2, "worker1"), (3, "worker1")):
        assert f"[{node} r{rank}] step 2 loss" in done.stdout
        started = next(text for text in lines[rank] if text.startswith("rank "))
        assert started.startswith(f"rank {rank} of 4 on {node}")      # world 4: torchrun kept --nproc-per-node 2
        assert "not mine ['--nproc-per-node', '7']" in started           # ... and the script got its own
    logs = tmp_path / "run"
    assert "[master r1] step 2 loss" in (logs / "master.log").read_text()
    worker_log = (logs / "worker1.log").read_text()
    assert "[worker1 r3] step 2 loss" in worker_log and "[master" not in worker_log
    plan = json.loads((logs / "plan.json").read_text())
    assert [n["env"]["GLOO_SOCKET_IFNAME"] for n in plan["nodes"]] == ["eth0", "eth0"]
    assert plan["master_addr"] == clean_lab.node("master").ipv4
    assert "all 4 ranks exited with code 0" in done.stderr and "port 29500 on master is free again" in done.stderr
    assert json.loads((logs / "result.json").read_text())["ok"] is True
    # The probes that need torch ran in these very processes before the script (one torchrun and
    # one torch import per rank, launch/in_ranks.py): the pids that waited at the gate trained.
    probed = json.loads((logs / "probes-in-ranks.json").read_text())
    trained = {int(m[1]): int(m[2]) for m in re.finditer(r"\] rank (\d) of 4 on \w+ \(pid (\d+)\)", done.stdout)}
    assert {r["rank"]: r["pid"] for r in probed["ranks"]} == trained and sorted(trained) == [0, 1, 2, 3]
    assert "DDP_PREFLIGHT_" not in done.stdout + done.stderr          # none of their lines shown
    assert_nothing_left(clean_lab, before)


def test_a_failing_rank_stops_every_node_and_its_exit_code_is_reported(clean_lab, tmp_path):
    before = counts(clean_lab)
    started = time.monotonic()
    done = launch(clean_lab, tmp_path, "--no-probes",
                  script_args=("--steps", "1000", "--step-time", "0.2", "--fail-rank", "3", "--fail-step", "3"))
    assert done.returncode == 1, (done.stdout[-3000:], done.stderr[-3000:])
    assert time.monotonic() - started < 90          # 1000 steps would take 200 s: the others were stopped
    assert "training failed: rank 3 on worker1 ended with exit code 3; every node was stopped" in done.stderr
    assert "rank 3 on worker1: exit code 3" in done.stderr
    assert "rank 2 on worker1: signal 15 (SIGTERM), stopped by torchrun when rank 3 failed" in done.stderr
    for rank in (0, 1):
        # Stopped by the launcher, or already failed on their own as Gloo lost rank 3: either way an exit.
        line = next(line for line in done.stderr.splitlines() if line.startswith(f"  rank {rank} on master: "))
        assert line.endswith("stopped by ddp-preflight") or line.endswith("exit code 1"), line
    assert "[worker1 r3] rank 3 exits with code 3 on purpose" in done.stdout
    assert_nothing_left(clean_lab, before)


def start_and_wait_for_steps(lab, tmp_path) -> subprocess.Popen:
    proc = subprocess.Popen(command(lab, tmp_path, "--no-probes", script_args=("--steps", "1000", "--step-time", "0.2")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    stepping: set[str] = set()
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        if " step 1 loss" in line:
            stepping.add(line.split("]")[0])
        if len(stepping) == 4 or time.monotonic() > deadline:
            break
    assert len(stepping) == 4, stepping
    return proc


def test_ctrl_c_on_the_master_stops_every_rank_on_every_node(clean_lab, tmp_path):
    before = counts(clean_lab)
    proc = start_and_wait_for_steps(clean_lab, tmp_path)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 1, stderr[-3000:]
    assert "stopping every node: interrupted (Ctrl-C)" in stderr and "Traceback" not in stderr
    for rank, node in ((0, "master"), (1, "master"), (2, "worker1"), (3, "worker1")):
        assert f"rank {rank} on {node}: signal 15 (SIGTERM), stopped by ddp-preflight" in stderr
    assert "port 29500 on master is free again" in stderr
    assert_nothing_left(clean_lab, before)


def test_killing_ddp_preflight_itself_still_leaves_nothing(clean_lab, tmp_path):
    before = counts(clean_lab)
    proc = start_and_wait_for_steps(clean_lab, tmp_path)
    proc.kill()                 # no handler runs: the dropped connections make each node stop its group
    proc.communicate(timeout=30)
    assert_nothing_left(clean_lab, before)


def test_a_failed_check_refuses_the_launch_and_force_launches_anyway(clean_lab, tmp_path):
    clean_lab.add_fault("port-busy@master")
    before = counts(clean_lab)      # the leftover holding the port is the fault's, not the run's
    refused = launch(clean_lab, tmp_path, "--no-probes")
    assert refused.returncode == 1
    assert "not launching: master-port on master failed: port 29500 on master is held by PID" in refused.stderr
    assert "--force" in refused.stderr and not (tmp_path / "run").exists()
    assert left_since(clean_lab, before) == {}

    forced = launch(clean_lab, tmp_path, "--no-probes", "--force")
    assert forced.returncode == 1
    assert "launching anyway (--force)" in forced.stderr
    # The one judge names the failure from torchrun's own words (its store's port in use): the headline.
    lines = forced.stderr.splitlines()
    assert ("ddp-preflight: training failed: torchrun on master could not listen on the master port 29500: it is in "
            "use (EADDRINUSE); no rank started; every node was stopped") in lines, forced.stderr
    assert any(line.startswith("  master: torchrun failed: DistNetworkError: ") and "EADDRINUSE" in line
               for line in lines), forced.stderr
    assert "rank 2 on worker1: not started" in forced.stderr
    assert left_since(clean_lab, before) == {}


def test_sixteen_ranks_launch_with_bfloat16_rounding_not_taken_for_wrong_results(clean_lab, tmp_path):
    # Issue 10: at 16 ranks a bfloat16 reduce_scatter rounded past the probe's old fixed 1%, the
    # collectives check failed, and the launch was refused (2 of 2 runs).
    before = counts(clean_lab)
    done = launch(clean_lab, tmp_path, "--only", "collectives", nproc=8, script_args=("--steps", "1"))
    assert done.returncode == 0, said(done)
    assert "not launching" not in done.stderr and "returns wrong results" not in done.stdout
    assert "on 2 node(s) x 8 = 16 ranks" in done.stderr and "all 16 ranks exited with code 0" in done.stderr
    assert_nothing_left(clean_lab, before)


def test_a_script_missing_on_one_node_is_one_line_naming_it(clean_lab, tmp_path):
    before = counts(clean_lab)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    config = tmp_path / "cluster.toml"
    config.write_text(f'code_dir = "{TRAIN.parent}"\n[nodes.worker1]\ncode_dir = "{elsewhere}"\n')
    done = launch(clean_lab, tmp_path, "--no-probes", "--config", str(config), "--only", "node-reachable")
    assert done.returncode == 1
    assert (f"training failed on worker1: the script {elsewhere}/train_ddp.py does not exist here" in done.stderr)
    assert "set code_dir for this node" in done.stderr
    assert_nothing_left(clean_lab, before)


@pytest.mark.parametrize("options, message", [
    (("--env", "NOEQUALS"), "--env 'NOEQUALS' has no '='"),
    (("--force",), None),
])
def test_bad_launch_input_is_a_usage_error_before_any_node_is_contacted(clean_lab, tmp_path, options, message):
    if message is None:     # --force without --launch
        done = subprocess.run([*CLI, *NODES, "--ssh-config", str(clean_lab.ssh_config), "--force"],
                              capture_output=True, text=True, timeout=60)
        message = "--force goes with --launch"
    else:
        done = launch(clean_lab, tmp_path, *options)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and message in done.stderr


def test_the_python_api_streams_lines_and_stops_on_request(clean_lab, tmp_path):
    """What the dashboard and hangwatch use: Launch.start/on_line/rank_pids/tail/stop/wait."""
    from ddp_preflight.launch import Launch, build_plan, parse_command
    from ddp_preflight.preflight.checks import FACT_CHECKS, run_checks
    from ddp_preflight.preflight.cluster import Cluster, Target, gather
    from ddp_preflight.preflight.model import Context, Options, Report

    before = counts(clean_lab)
    targets = [Target(n, sys.executable) for n in NODES]
    with Cluster(targets, str(clean_lab.ssh_config)) as cluster:
        nodes, master_addr = gather(cluster, {"master_port": 29500, "master_addr": None, "launch_args": [],
                                              "nnodes": 2, "nproc_per_node": 2})
        options = Options(nproc_per_node=2, master_addr=master_addr)
        report = Report(tuple(run_checks(Context(tuple(nodes), options), FACT_CHECKS)), NODES)
        plan = build_plan(report, nodes, options, targets,
                          parse_command([str(TRAIN), "--steps", "1000", "--step-time", "0.2"]), cwd=str(REPO))
        launch = Launch(cluster, plan, tmp_path / "api")
        seen = []
        launch.on_line.append(seen.append)
        launch.start()
        deadline = time.monotonic() + 120
        while not all((r.step or 0) >= 2 for r in launch.ranks.values()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert all(r.step >= 2 and r.last_line.startswith("step ") for r in launch.ranks.values())
        pids = launch.rank_pids()
        assert {n: len(p) for n, p in pids.items()} == {"master": 2, "worker1": 2}
        for node, by_rank in pids.items():
            assert set(by_rank.values()) <= set(clean_lab.processes(node))
        assert any(text.startswith("step ") for text in launch.tail("worker1", 3))
        launch.stop("quit from the dashboard")
        result = launch.wait(30)
    assert result is not None and result.stop_reason == "quit from the dashboard" and result.exit_code == 1
    assert [r.outcome() for r in result.ranks] == ["signal 15 (SIGTERM), stopped by ddp-preflight"] * 4
    assert {line.rank for line in seen} >= {0, 1, 2, 3} and result.port_free is True
    assert_nothing_left(clean_lab, before)


def test_hangwatch_runs_on_every_node_and_stop_on_hang_ends_a_deadlocked_run(clean_lab, tmp_path):
    before = counts(clean_lab)
    hang = REPO / "examples" / "hang_train.py"
    argv = command(clean_lab, tmp_path, "--no-probes", "--stop-on-hang")
    argv = argv[:argv.index("--") + 1] + [str(hang), "--steps", "500", "--fault", "leave", "--rank", "2", "--at", "5"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=REPO)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 1, done.stderr[-3000:]
    assert "hangwatch: DEADLOCK: rank 2 left the loop: idle at hang_train.py:" in done.stderr, done.stderr[-3000:]
    assert "training stopped (hangwatch named a hang (--stop-on-hang)" in done.stderr
    bundles = list((tmp_path / "run" / "incidents").glob("incident-*-deadlock"))
    assert len(bundles) == 1 and (bundles[0] / "report.txt").is_file()
    assert_nothing_left(clean_lab, before)


@pytest.mark.parametrize("recorder", ["on by default", "--no-flight-recorder"])
def test_a_launched_deadlock_names_each_ranks_collective_from_its_flight_recorder(clean_lab, tmp_path, recorder):
    """No opt-in in the script (hang_train.py without --flight): the launcher runs every rank
    through its bootstrap, and hangwatch asks each one where it is in the sequence of collectives."""
    before = counts(clean_lab)
    hang = REPO / "examples" / "hang_train.py"
    argv = command(clean_lab, tmp_path, "--no-probes", "--stop-on-hang",
                   *(["--no-flight-recorder"] if recorder == "--no-flight-recorder" else []))
    argv = argv[:argv.index("--") + 1] + [str(hang), "--steps", "500", "--fault", "leave", "--rank", "2", "--at", "6"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=REPO)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if line.startswith("ddp-preflight: hangwatch: DEADLOCK: ")]
    assert len(said) == 1 and "rank 2 left the loop" in said[0], done.stderr[-3000:]
    if recorder == "--no-flight-recorder":
        assert "Flight Recorder" not in said[0]
    else:
        note = said[0].split("; Flight Recorder: ")[1]
        waiting, left = note.split(", rank 2 at ")
        assert waiting.startswith("ranks 0,1,3 at all_reduce #"), note
        # The rank that left is one collective behind the ranks waiting for it.
        assert left == f"all_reduce #{int(waiting.split('#')[1]) - 1}", note
    assert_nothing_left(clean_lab, before)


def test_ranks_that_never_create_a_process_group_are_said_to_train_alone(clean_lab, tmp_path):
    # nanochat on CPU without its Gloo patch: torchrun starts 4 ranks, none calls
    # init_process_group, each trains its own model (4000 steps of a 1024-wide layer: 25-60 s here,
    # most of a step in its forward, backward and optimizer, as a real model's) and exits 0. Named
    # within the threshold, not after hangwatch's 30 s: their stacks show each in its step. (1600
    # steps took 10-25 s: on a quiet box the ranks ended before the notice, 1 run in 4, and only the
    # end said it, as the short run below checks.)
    before = counts(clean_lab)
    hang = REPO / "examples" / "hang_train.py"
    argv = command(clean_lab, tmp_path, "--no-probes")
    argv = argv[:argv.index("--") + 1] + [str(hang), "--steps", "4000", "--fault", "alone", "--width", "1024",
                                          "--step-time", "0"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 1, done.stderr[-3000:]          # exited 0 each, but no run of 4 ranks
    said = [line for line in done.stderr.splitlines() if line.startswith("ddp-preflight: hangwatch: ")
            and "each rank trains alone" in line]
    assert len(said) == 1, done.stderr[-3000:]
    alone = said[0].removeprefix("ddp-preflight: hangwatch: ")
    found = re.fullmatch(r"ranks 0,1,2,3 \(world 4\) used CPU for (\d+) s without a single TCP connection to the "
                         r"store or to each other, each in a training step of its own \((.+)\): each rank trains "
                         r"alone: no process group was created \(init_process_group skipped on CPU\?\)", alone)
    assert found, alone
    assert DEFAULT_THRESHOLD <= int(found[1]) < ALONE_AFTER, alone
    steps = {f"backward at hang_train.py:{_line(hang, 'loss.backward()')}",
             f"its optimizer at hang_train.py:{_line(hang, 'optimizer.zero_grad()')}",
             f"its optimizer at hang_train.py:{_line(hang, 'optimizer.step()')}",
             f"a module's forward at hang_train.py:{_line(hang, 'loss = model(batch).pow(2).mean()')}"}
    assert set(found[2].split("; ")) <= steps, found[2]
    # The summary's headline says the training failed, and why; the line under it, hangwatch's words.
    summary = done.stderr[done.stderr.index("ddp-preflight: training failed"):].splitlines()
    assert summary[0].startswith(ALONE_HEADLINE), summary
    assert summary[1] == f"  hangwatch: {alone}"
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert (result["ok"], result["notes"], result["alone"]) == (False, [summary[1].strip()], [0, 1, 2, 3])
    assert not (tmp_path / "run" / "incidents").exists()        # not a hang: no bundle
    # A run shorter than the threshold (60 steps of 0.05 s: no notice in time): its end says it all the same.
    argv = command(clean_lab, tmp_path / "short", "--no-probes")
    argv = argv[:argv.index("--") + 1] + [str(hang), "--steps", "60", "--fault", "alone"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert done.returncode == 1, done.stderr[-3000:]
    assert not [line for line in done.stderr.splitlines() if line.startswith("ddp-preflight: hangwatch: ")], \
        done.stderr[-3000:]
    summary = done.stderr[done.stderr.index("ddp-preflight: training failed"):].splitlines()
    assert summary[0].startswith(ALONE_HEADLINE) and summary[1] == "  rank 0 on master: exit code 0", summary
    # What the launch saved says it to explain too: the verdict, not "no failure found".
    explained = subprocess.run([*CLI, "explain", "--json", str(tmp_path / "short" / "run")], capture_output=True,
                               text=True, timeout=60, cwd=REPO)
    verdict = json.loads(explained.stdout)["diagnosis"]
    assert (verdict["kind"], verdict["world"], [e["rank"] for e in verdict["evidence"]]) == ("alone", 4, [0, 1, 2, 3])
    assert_nothing_left(clean_lab, before)


ALONE_HEADLINE = ("ddp-preflight: training failed: the 4 ranks exited with code 0, but none ever joined a process group: "
                  "each imported torch, ran not one collective (its Flight Recorder) and was seen with no TCP connection "
                  "to the store or a peer, so each trained alone (WORLD_SIZE 4; init_process_group skipped?)")
