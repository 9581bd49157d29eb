"""`hangwatch attach` on real 2-node x 2-rank Gloo training in the lab, over the lab's sshd.

Each test starts examples/hang_train.py with torchrun on both nodes, makes it fail one way,
and checks what hangwatch names, how fast, and that it names nothing when nothing is wrong."""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp_preflight.hangwatch.stall import DEFAULT_THRESHOLD
from ddp_preflight.hangwatch.verdicts import NATIVE_WAIT

from .hangjob import STARTUP, wait_until, went_first

pytestmark = pytest.mark.timeout(300)


def test_a_rank_that_leaves_the_loop_is_named_with_its_line_within_the_threshold(watched, tmp_path):
    called = tmp_path / "on-hang.txt"
    watch, job = watched("--steps", "500", "--fault", "leave", "--rank", "3", "--at", "5", port=29631,
                         watch_args=("--on-hang", f"echo >> {called}"))
    left_at = job.fault_time()
    event = watch.wait_for("diagnosis", DEFAULT_THRESHOLD + 20)
    latency = event["time"] - left_at
    diagnosis = event["snapshot"]["diagnosis"]
    assert diagnosis["kind"] == "deadlock" and diagnosis["culprits"] == [3], diagnosis
    assert "rank 3 left the loop: idle at hang_train.py:" in diagnosis["summary"]
    assert "ranks 0,1,2 wait in all_reduce" in diagnosis["summary"]
    assert latency <= DEFAULT_THRESHOLD + 2, f"named after {latency:.1f} s"
    ranks = {r["rank"]: r for r in event["snapshot"]["ranks"]}
    assert ranks[3]["frame"] == f"hang_train.py:{_line('time.sleep(3600)')}" and ranks[3]["node"] == "worker1"
    assert all(ranks[r]["op"] == "all_reduce" and ranks[r]["frame"] == f"hang_train.py:{_line('loss.backward()')}"
               for r in (0, 1, 2))
    # The victims sit at ~0% CPU in a futex like the culprit sits in its sleep: the stacks decide.
    assert all(ranks[r]["cpu"] < 5 for r in range(4))
    # The bundle: JSON and a readable report, the environment's secrets redacted.
    bundle = Path(watch.wait_for("incident", NATIVE_WAIT + 5)["path"])     # with the native frames
    assert bundle.parent == tmp_path / "incidents"
    document = json.loads((bundle / "incident.json").read_text())
    assert document["snapshot"]["diagnosis"]["culprits"] == [3]
    assert set(document["nodes"]) == {"master", "worker1"} and document["nodes"]["worker1"]["torch"].startswith("2.")
    report = (bundle / "report.txt").read_text()
    assert "DEADLOCK" in report and "c10d::Reducer::finalize_backward" in report and "GLOO_SOCKET_IFNAME=eth0" in report
    # --on-hang ran the user's command with the bundle's path.
    for _ in range(50):
        if called.exists() and called.read_text().strip():
            break
        time.sleep(0.1)
    assert called.read_text().strip() == str(bundle)


def test_ranks_in_different_collectives_are_a_mismatch_naming_the_odd_rank(watched):
    watch, job = watched("--steps", "500", "--fault", "mismatch", "--rank", "1", "--at", "5", port=29632)
    job.fault_time()
    diagnosis = watch.wait_for("diagnosis", DEFAULT_THRESHOLD + 20)["snapshot"]["diagnosis"]
    assert diagnosis["kind"] == "mismatch" and diagnosis["culprits"] == [1], diagnosis
    assert f"rank 1 is in all_gather at hang_train.py:{_line('dist.all_gather(')}" in diagnosis["summary"]
    assert "ranks 0,2,3 wait in all_reduce" in diagnosis["summary"]


def test_a_rank_computing_for_30_s_is_a_straggler_never_a_hang(watched):
    watch, job = watched("--steps", "40", "--fault", "straggle", "--rank", "0", "--at", "5", "--seconds", "30",
                         port=29633)
    started = job.fault_time()
    # The straggle said after it began (its own stamp): on a loaded box rank 0 may straggle at
    # start-up too (importing torch._dynamo in DDP's constructor while the others wait in its first
    # broadcast), which is said as well, and is true.
    straggler = watch.wait_for("straggler", DEFAULT_THRESHOLD + 20, where=lambda e: e["time"] >= started)
    # Where it computes now (compute()'s loop), never where a stack from before showed it.
    assert "not a hang" in straggler["text"] and \
        f"rank 0 is computing at hang_train.py:{_line('a = torch.tanh(a @ a)')} (compute)" in straggler["text"], \
        watch.timeline(started)
    assert straggler["snapshot"]["diagnosis"]["culprits"] == [0]
    assert "idle" in straggler["text"] and "of the last" in straggler["text"]     # the measured wait share
    assert job.wait(60) == [0, 0], job.lines[-10:]                                  # training went on
    watch.wait_for("resumed", 5)
    assert not watch.of("diagnosis") and not watch.of("incident"), watch.of("diagnosis")


def _verdict(diagnosis):
    return (diagnosis["kind"], diagnosis["culprits"], diagnosis["candidates"], diagnosis["reason"],
            diagnosis["certainty"])


def test_a_rank_that_exits_is_named_with_its_own_code_from_its_record(watched):
    # With the script opted in (import hangwatch.flight) the rank records its sys.exit(3) before its
    # teardown: certain, whichever end the agents saw first (its peer on worker1 often aborts first,
    # and torchrun stops it mid-exit).
    watch, job = watched("--steps", "500", "--fault", "exit", "--rank", "3", "--at", "5", "--flight", port=29634)
    job.fault_time()
    diagnosis = watch.wait_for("diagnosis", 30)["snapshot"]["diagnosis"]
    assert _verdict(diagnosis) == ("exited", [3], [], "exit-code", "certain"), diagnosis["summary"]
    assert diagnosis["summary"].startswith("rank 3 on worker1 ended with exit code 3; then "), diagnosis["summary"]
    assert "clocks" not in diagnosis["summary"], diagnosis["summary"]     # the lab's nodes share one clock


def test_a_rank_that_exits_is_named_from_its_exit_alone(watched):
    # No record, no output file: its code 3 is its own when the agent reads it; when its peer
    # beside it aborts first (the lost peer) and torchrun stops it mid-exit, it had already closed
    # connections of its own at its peer's end, so it was the one leaving.
    watch, job = watched("--steps", "500", "--fault", "exit", "--rank", "3", "--at", "5", port=29646)
    job.fault_time()
    diagnosis = watch.wait_for("diagnosis", 30)["snapshot"]["diagnosis"]
    # Which evidence the run leaves varies: its code (certain when the kernel's TIME_WAIT says it
    # closed first too), or, when torchrun stopped it mid-exit, the kernel's TIME_WAIT alone. Where
    # neither is left (its teardown ended in SIGABRT, its connections reset: CI), the exits alone
    # cannot order it and rank 2 beside it: both are candidates. Never rank 2 alone.
    said = (diagnosis["culprits"], diagnosis["candidates"], diagnosis["certainty"])
    if diagnosis["culprits"]:
        assert said[:2] == ([3], []) and diagnosis["reason"] in ("exit-code", "leaving") \
            and diagnosis["certainty"] in ("certain", "likely"), diagnosis["summary"]
    else:
        assert said == ([], [2, 3], "unsure"), diagnosis["summary"]


def test_exits_are_ordered_on_the_masters_clock_when_a_nodes_clock_is_behind(watched, tmp_path):
    # A lab's nodes share one clock; a node whose clock is 3 s behind is made with libfaketime on
    # worker1 (the wall clock of every process there, the agent's and its children's; monotonic
    # time as it is). Node programs run `python -I`, so no PYTHON* variable could do it.
    faketime = next(iter(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")), None)
    assert faketime, "libfaketime is missing: scripts/system-deps.sh installs it"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nif [ "$(cat /proc/sys/kernel/hostname)" = worker1 ]; then '
                      f'export LD_PRELOAD={faketime} FAKETIME=-3 FAKETIME_DONT_FAKE_MONOTONIC=1; fi\n'
                      f'exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    # Rank 0 on master raises (exit code 1, as a lost peer gives too); worker1's ranks lose it and
    # die after it, but their own stamps are 3 s early: read as stamped, a rank on worker1 would
    # be the first to end.
    watch, job = watched("--steps", "500", "--fault", "raise", "--rank", "0", "--at", "5", port=29645,
                         watch_args=("--python", str(python)))
    job.fault_time()
    diagnosis = watch.wait_for("diagnosis", 30)["snapshot"]["diagnosis"]
    # Its exit code 1 (or the abort of its teardown) is what a lost peer gives too; the kernel's word
    # decides: rank 0 closed its connections with every other rank before they closed theirs. Its
    # error is then its own failure; a SIGTERM from torchrun mid-teardown says only that it was leaving.
    assert _verdict(diagnosis) == ("exited", [0], [], went_first(diagnosis, 0), "certain"), diagnosis["summary"]
    assert re.search(r"the nodes' clocks are [23]\.\d s apart: exit times are put on the master's clock",
                     diagnosis["summary"]), diagnosis["summary"]


def test_a_killed_rank_is_named_by_its_signal(watched):
    watch, job = watched("--steps", "100000", port=29635)
    found = watch.wait_for("rank-found", 60, lambda e: e.get("rank") == 2)
    time.sleep(3)
    os.kill(found["pid"], signal.SIGKILL)
    diagnosis = watch.wait_for("diagnosis", 30)["snapshot"]["diagnosis"]
    assert _verdict(diagnosis) == ("exited", [2], [], "killed", "certain"), diagnosis["summary"]
    assert diagnosis["summary"].startswith("rank 2 on worker1 was killed (signal 9, SIGKILL); then rank 3 (stopped by "
                                           "its launcher, +"), diagnosis["summary"]


def test_a_firewall_that_stalls_rendezvous_points_to_the_preflight_checks(watched, clean_lab):
    clean_lab.add_fault("firewall@worker1")
    watch, job = watched("--steps", "50", port=29636)
    diagnosis = watch.wait_for("diagnosis", 60)["snapshot"]["diagnosis"]
    assert diagnosis["kind"] == "rendezvous-stall", diagnosis
    assert "ephemeral-ports" in diagnosis["summary"] and "firewall" in diagnosis["summary"]
    assert sorted(diagnosis["culprits"]) == [0, 1, 2, 3]


def test_a_rank_that_never_calls_init_process_group_is_named_with_its_node(watched):
    # The store the ranks share, read by the agents, says who never got there: rank 3, on worker1.
    watch, job = watched("--steps", "50", "--fault", "skip-init", "--rank", "3", port=29640)
    diagnosis = watch.wait_for("diagnosis", 60)["snapshot"]["diagnosis"]
    assert diagnosis["kind"] == "rendezvous-stall" and diagnosis["culprits"] == [3], diagnosis
    # On failure: every rank's evidence and the watcher's timed inputs (a full run here once left rank 1
    # out of the waiting ranks, its state not kept).
    assert diagnosis["summary"] == (f"rank 3 never checked in (worker1's): it is idle at hang_train.py:"
                                    f"{_line('time.sleep(5400)')} (main); ranks 0,1,2 wait in init_process_group"), \
        (diagnosis["evidence"], watch.timeline(min(e["time"] for e in watch.events)))


def test_a_lost_node_is_reported_and_the_others_are_still_watched(watched):
    watch, job = watched("--steps", "500", "--fault", "leave", "--rank", "0", "--at", "8", port=29637)
    # Both of worker1's ranks known (torchrun starts them a moment apart), then its agent dies.
    wait_until(lambda: len([e for e in watch.of("rank-found") if e.get("node") == "worker1"]) == 2, STARTUP,
               "worker1's two ranks were never found")
    hello = _agent_pid(watch, "worker1")
    os.kill(hello, signal.SIGKILL)        # the agent on worker1 dies, as with a dropped SSH link
    lost = watch.wait_for("node", 10, lambda e: "worker1" in e["text"] and "stopped" in e["text"])
    assert "the other nodes are still watched" in lost["text"]
    diagnosis = watch.wait_for("diagnosis", DEFAULT_THRESHOLD + 25)["snapshot"]["diagnosis"]
    # The master's ranks are still classified: rank 0 left the loop, rank 1 waits; worker1's
    # ranks are unknown (its agent is gone), and not blamed.
    assert diagnosis["kind"] == "deadlock" and diagnosis["culprits"] == [0], diagnosis["summary"]
    assert "ranks 2,3 unknown (not watched: worker1's agent is gone)" in diagnosis["summary"]
    states = {r["rank"]: (r["node"], r["state"]) for r in watch.of("diagnosis")[0]["snapshot"]["ranks"]}
    assert states[0] == ("master", "idle") and states[1] == ("master", "collective")


def test_a_dead_link_is_a_lost_node_within_seconds_and_nothing_is_judged_from_its_old_data(watched, clean_lab):
    watch, job = watched("--steps", "100000", port=29639)
    for rank in range(4):
        watch.wait_for("rank-found", STARTUP, lambda e, rank=rank: e.get("rank") == rank)
    # Training: every rank computing, the old data worker1 leaves behind says so.
    wait_until(lambda: any(re.search(r"step [1-9]\d loss", line) for _, line in job.lines), STARTUP, "training steps")
    netns = clean_lab.node("worker1").netns
    subprocess.run(["ip", "-n", netns, "link", "set", "eth0", "down"], check=True)
    down_at = time.time()
    try:
        lost = watch.wait_for("node", 15, lambda e: e["text"].startswith("worker1 lost"))
        # Down past the threshold: ranks 0,1 wait in all_reduce for ranks nobody sees.
        said = watch.wait_for("notice", DEFAULT_THRESHOLD + 20, lambda e: (e.get("snapshot") or {}).get("diagnosis"))
    finally:
        subprocess.run(["ip", "-n", netns, "link", "set", "eth0", "up"], check=True)
    assert lost["time"] - down_at <= 5 + 1.5, f"lost after {lost['time'] - down_at:.1f} s"
    diagnosis = said["snapshot"]["diagnosis"]
    assert diagnosis["kind"] == "unseen" and diagnosis["culprits"] == [], diagnosis
    assert said["text"] == ("ranks 0,1 wait in all_reduce; ranks 2,3 unknown (not watched: worker1's agent went "
                            "silent): a hang cannot be told from a straggler")
    assert {r["rank"]: r["state"] for r in said["snapshot"]["ranks"] if r["node"] == "worker1"} == \
        {2: "unknown", 3: "unknown"}
    back = watch.wait_for("node", 60, lambda e: e["text"].startswith("worker1 watched again"))
    # Nothing was judged while worker1 was lost: no hang, no bundle, no straggler from its old data.
    while_lost = [e for e in watch.events if lost["time"] <= e["time"] <= back["time"]]
    assert not [e for e in while_lost if e["event"] in ("diagnosis", "incident", "straggler")], while_lost
    assert len([e for e in watch.of("node") if e["text"].startswith("worker1 lost")]) == 1


def _agent_pid(watch, node):
    for _ in range(50):
        for e in watch.of("node"):
            if e.get("node") == node and e.get("agent_pid"):
                return e["agent_pid"]
        time.sleep(0.1)
    raise AssertionError("no agent pid reported for " + node)


def _line(text: str) -> int:
    source = (Path(__file__).parents[2] / "examples" / "hang_train.py").read_text().splitlines()
    return next(i for i, line in enumerate(source, 1) if text in line)


def test_with_the_flight_recorder_opted_in_the_deadlock_gives_each_ranks_collective_number(watched):
    watch, job = watched("--steps", "500", "--fault", "leave", "--rank", "2", "--at", "6", "--flight", port=29638)
    job.fault_time()
    diagnosis = watch.wait_for("diagnosis", DEFAULT_THRESHOLD + 20)["snapshot"]["diagnosis"]
    assert diagnosis["kind"] == "deadlock" and diagnosis["culprits"] == [2], diagnosis
    note = diagnosis["summary"].split("Flight Recorder: ")[1]
    waiting, left = note.split(", rank 2 at ")
    assert waiting.startswith("ranks 0,1,3 at all_reduce #")
    # The rank that left is one collective behind the ranks waiting for it.
    assert int(left.split("#")[1]) == int(waiting.split("#")[1]) - 1, note


def test_a_torchrun_waiting_for_a_node_that_never_starts_names_that_node(clean_lab, tmp_path):
    # Seen with nanochat: torchrun started on master (node rank 0 of 2) and never on worker1. No
    # rank ever starts, so there are no ranks to watch: the launcher is.
    from .hangjob import SCRIPT, hangwatch
    watch = hangwatch(clean_lab, "--incident-dir", str(tmp_path / "incidents"))
    master = clean_lab.node("master").ipv4
    torchrun = clean_lab.popen("master", ["env", "GLOO_SOCKET_IFNAME=eth0", sys.executable, "-m",
                                          "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
                                          "--node-rank", "0", "--master-addr", master, "--master-port", "29647",
                                          str(SCRIPT), "--steps", "50"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        event = watch.wait_for("diagnosis", DEFAULT_THRESHOLD + 40)
        diagnosis = event["snapshot"]["diagnosis"]
        assert (diagnosis["kind"], diagnosis["culprits"], diagnosis["nodes"], diagnosis["node_ranks"],
                diagnosis["reason"], diagnosis["certainty"]) == \
            ("rendezvous-stall", [], ["worker1"], [1], "never-checked-in", "likely"), diagnosis
        assert re.fullmatch(rf"torchrun on master \(node rank 0 of 2\) has started no rank for \d+ s: it waits in its "
                            rf"rendezvous at {master}:29647 for the other nodes' torchrun; node rank 1 never checked "
                            rf"in: worker1 runs no torchrun of this run", diagnosis["summary"]), diagnosis["summary"]
    finally:
        os.killpg(torchrun.pid, signal.SIGKILL)
        torchrun.wait(10)
        watch.stop()
