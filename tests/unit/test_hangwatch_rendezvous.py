"""Rendezvous stalls that say who never checked in, and ranks that never talk (issue 12).

The watcher's side is replayed on agent messages recorded from lab runs (record.py beside them):
skip-init.jsonl, where rank 3 (worker1) never calls init_process_group while ranks 0,1,2 wait
in it, and alone.jsonl, where no rank creates a process group. The agent's side runs on real
local processes and sockets and a real torchrun job's store."""

import json
import re
import socket
import subprocess
import sys
import time

from ddp_preflight.hangwatch import classify
from ddp_preflight.hangwatch.reducer import ALONE_AFTER
from ddp_preflight.hangwatch.stall import DEFAULT_THRESHOLD
from ddp_preflight.hangwatch.text import summary
from ddp_preflight.launch.outcome import LaunchedRank, LaunchResult, NodeState, render
from ddp_preflight.node import agent, store

from .ports import free_port as _free_port
from .test_hangwatch_watch import AGENT, replay

RANK3 = 4975                      # rank 3's pid in skip-init.jsonl (worker1)
STORE = "10.213.1.200:29690"      # the recorded run's MASTER_ADDR:MASTER_PORT


def _records(name: str) -> list[dict]:
    return [json.loads(line) for line in (AGENT / f"{name}.jsonl").read_text().splitlines()[1:]]


def changed(name: str, change) -> dict:
    """replay()'s lost= and then= for a recording whose messages change(record) rewrites
    (None: the message as recorded)."""
    swaps = {}
    for record in _records(name):
        message = change(record)
        if message is not None:
            swaps[(record["at"], record["node"])] = message
    return {"lost": lambda record: (record["at"], record["node"]) in swaps,
            "then": [(at, lambda w, node=node, message=message: w.receive(node, message))
                     for (at, node), message in swaps.items()]}


def _stores(said):
    """What every agent's stacks said of the store, replaced by `said` (absent: None)."""
    def change(record):
        message = record["msg"]
        if message["type"] != "stacks" or "stores" not in message:
            return None
        return {k: v for k, v in message.items() if k != "stores"} if said is None else {**message, "stores": said}
    return change


def _diagnosis(events):
    named = [e for e in events if e.kind == "diagnosis"]
    assert len(named) == 1, [e.text for e in events]
    return named[0].snapshot.diagnosis


# -- who never checked in ----------------------------------------------------------------------

def test_a_rank_that_never_called_init_process_group_is_named_with_its_node(tmp_path):
    header, watcher, events = replay("skip-init", tmp_path)
    diagnosis = _diagnosis(events)
    assert diagnosis.kind == "rendezvous-stall" and diagnosis.culprits == [header["rank"]] == [3]
    assert summary(diagnosis) == ("rank 3 never checked in (worker1's): it is idle at hang_train.py:65 (main); "
                                 "ranks 0,1,2 wait in init_process_group")
    assert len([e for e in events if e.kind == "incident"]) == 1


def test_no_rank_is_named_missing_unless_the_store_says_so(tmp_path):
    unreadable = [{"master": STORE, "world_size": 4, "error": "torch.distributed.DistNetworkError: "
                   "failed to connect to 10.213.1.200:29690 (Connection refused)"}]
    header, watcher, events = replay("skip-init", tmp_path / "unreadable", **changed("skip-init", _stores(unreadable)))
    diagnosis = _diagnosis(events)
    assert diagnosis.culprits == [] and summary(diagnosis) == (
        "ranks 0,1,2 wait in init_process_group; rank 3 is idle at hang_train.py:65 (main); the store at "
        f"{STORE} could not be read ({unreadable[0]['error']}), so who never checked in cannot be told")
    # An agent that does not read the store (older), or keys it does not know (NCCL keeps none per rank).
    header, watcher, events = replay("skip-init", tmp_path / "unread", **changed("skip-init", _stores(None)))
    assert summary(_diagnosis(events)).endswith("; the store was not read, so who never checked in cannot be told")
    empty = [{"master": STORE, "world_size": 4, "checked_in": [], "how": "list_keys"}]
    header, watcher, events = replay("skip-init", tmp_path / "empty", **changed("skip-init", _stores(empty)))
    assert summary(_diagnosis(events)).endswith(f"; the store at {STORE} holds no rank's check-in (with NCCL it "
                                               "never does), so who never checked in cannot be told")


def test_what_the_store_said_before_the_ranks_waited_is_not_used(tmp_path):
    # The agents' answers are lost; one from 3 s in, before any rank was stuck, says rank 3 is missing.
    early = {"type": "stacks", "t": 0.0, "id": 1, "stacks": {},
             "stores": [{"master": STORE, "world_size": 4, "checked_in": [0, 1, 2], "how": "list_keys"}]}
    then = [(3.0, lambda w: w.receive("master", early)), *changed("skip-init", _stores(None))["then"]]
    header, watcher, events = replay("skip-init", tmp_path, lost=changed("skip-init", _stores(None))["lost"],
                                     then=then)
    diagnosis = _diagnosis(events)
    assert diagnosis.culprits == [] and "the store was not read" in summary(diagnosis)


def test_a_rank_no_agent_found_is_placed_by_the_launch_plan(tmp_path):
    unseen = lambda record: record["msg"]["type"] == "rank" and record["msg"]["pid"] == RANK3   # noqa: E731
    header, watcher, events = replay("skip-init", tmp_path / "plan", lost=unseen,
                                     planned={0: "master", 1: "master", 2: "worker1", 3: "worker1"})
    diagnosis = _diagnosis(events)
    assert diagnosis.culprits == [3] and summary(diagnosis) == (
        "rank 3 never checked in (worker1's); ranks 0,1,2 wait in init_process_group")
    header, watcher, events = replay("skip-init", tmp_path / "attach", lost=unseen)
    assert summary(_diagnosis(events)).startswith("rank 3 never checked in (node unknown: no agent found it); ")


# -- ranks that never talk ---------------------------------------------------------------------

# alone.jsonl: 2 nodes x 2 ranks of hang_train.py --fault alone --width 1024 --step-time 0 (most
# of a step in forward, backward and the optimizer); their connections are first counted at 6.2 s.
ALONE = ("ranks 0,1,2,3 (world 4) used CPU for 9 s without a single TCP connection to the store or to each other, "
         "each in a training step of its own (a module's forward at hang_train.py:148; backward at "
         "hang_train.py:150; its optimizer at hang_train.py:151): each rank trains alone: no process group was "
         "created (init_process_group skipped on CPU?)")
# Where the stacks show no rank in a step of training, it is said after ALONE_AFTER.
ALONE_LATE = ("ranks 0,1,2,3 (world 4) used CPU for 30 s without a single TCP connection to the store or to each "
              "other: each rank trains alone: no process group was created (init_process_group skipped on CPU?)")


def _first_count(name: str) -> float:
    return min(r["at"] for r in _records(name) if r["msg"]["type"] == "sample"
               and any("tcp" in s for s in r["msg"]["ranks"]))


def _alone(events):
    return [(e.kind, e.text, e.data["alone"]) for e in events if "alone" in e.data]


def test_ranks_that_never_connect_are_said_to_train_alone_once_and_not_as_a_hang(tmp_path):
    header, watcher, events = replay("alone", tmp_path)
    said = [e for e in events if "alone" in e.data]
    assert _alone(events) == [("notice", ALONE, True)], [e.text for e in events]
    # Within the threshold's reach: the stacks asked when it passed showed every rank in its step.
    assert DEFAULT_THRESHOLD <= said[0].data["at"] - _first_count("alone") < DEFAULT_THRESHOLD + 1
    diagnosis = said[0].snapshot.diagnosis
    assert (diagnosis.kind, diagnosis.culprits, diagnosis.reason, len(diagnosis.evidence)) == \
        ("alone", [], "training", 4)
    # Not a hang: no bundle, nothing to stop; and it stands while they train (no "progress resumed").
    kinds = [e.kind for e in events]
    assert "diagnosis" not in kinds and "incident" not in kinds and "resumed" not in kinds
    assert not (tmp_path / "incidents").exists()
    assert watcher.snapshot().diagnosis.kind == "alone"


def _own_frames_only(record):
    """The stacks as if torch's frames were not there: each rank at its own lines alone."""
    message = record["msg"]
    if message["type"] != "stacks":
        return None
    stacks = {pid: [{**thread, "frames": [f for f in thread["frames"] if f.get("short_filename") == "hang_train.py"]}
                    for thread in dump] for pid, dump in message["stacks"].items()}
    return {**message, "stacks": stacks}


def _no_torch(record):
    message = record["msg"]
    if message["type"] != "sample" or not any("torch" in s for s in message["ranks"]):
        return None
    return {**message, "ranks": [{**s, "torch": False} for s in message["ranks"]]}


def test_without_a_training_step_in_the_stacks_it_waits_for_alone_after_and_without_torch_is_never_said(tmp_path):
    # A rank's set-up before init_process_group (imports, reading data) is given ALONE_AFTER.
    header, watcher, events = replay("alone", tmp_path / "own", **changed("alone", _own_frames_only))
    said = [e for e in events if "alone" in e.data]
    assert _alone(events) == [("notice", ALONE_LATE, True)], [e.text for e in events]
    assert said[0].data["at"] - _first_count("alone") >= ALONE_AFTER
    assert said[0].snapshot.diagnosis.reason is None
    # Processes that never imported torch (a script that prints, started by torchrun) train nothing.
    header, watcher, events = replay("alone", tmp_path / "plain", **changed("alone", _no_torch))
    assert not _alone(events), [e.text for e in events]
    assert watcher.snapshot().diagnosis is None


def test_ranks_that_finished_alone_before_it_was_said_are_still_of_the_world_and_unseen_ones_wait(tmp_path):
    # worker1's ranks finish their training (exit 0) 9 s in, before the threshold (a quiet box runs
    # them fast): they are still two of the four that each trained alone. Said for all four, once.
    def lost(record):
        return record["node"] == "worker1" and record["at"] >= 9.0 and record["msg"]["type"] in ("sample", "stacks")
    ends = [(9.0, lambda w, pid=pid: w.receive("worker1", {"type": "exit", "pid": pid, "t": 9.0, "code": 0}))
            for pid in (18376, 18377)]
    header, watcher, events = replay("alone", tmp_path / "done", lost=lost, then=ends)
    said = [e for e in events if "alone" in e.data]
    assert [e.text.split(" used CPU")[0] for e in said] == ["ranks 0,1,2,3 (world 4)"], [e.text for e in events]
    assert said[0].snapshot.diagnosis.reason == "training"
    # worker1 never watched at all (its ranks never seen): ranks 0 and 1 are half the world, said
    # only after ALONE_AFTER, of those seen.
    header, watcher, events = replay("alone", tmp_path / "half", lost=lambda record: record["node"] == "worker1")
    said = [e for e in events if "alone" in e.data]
    assert [e.text.split(" used CPU")[0] for e in said] == ["ranks 0,1 (world 4)"], [e.text for e in events]
    assert said[0].data["at"] - _first_count("alone") >= ALONE_AFTER


def _tcp(node: str, after: float, count: int):
    """Every count of `node`'s ranks from `after` on says `count` connections."""
    def change(record):
        message = record["msg"]
        if record["node"] != node or record["at"] < after or message["type"] != "sample" or \
                not any("tcp" in s for s in message["ranks"]):
            return None
        return {**message, "ranks": [{**s, "tcp": count} for s in message["ranks"]]}
    return change


def test_a_connection_keeps_it_unsaid_and_one_after_the_notice_takes_it_back(tmp_path):
    # worker1's ranks connect at their second count (a process group created after some set-up): never said.
    header, watcher, events = replay("alone", tmp_path / "early", **changed("alone", _tcp("worker1", 8.0, 1)))
    assert not _alone(events), [e.text for e in events]
    assert watcher.snapshot().diagnosis is None
    # master's ranks connect 20 s in, after the notice: it is taken back.
    header, watcher, events = replay("alone", tmp_path / "late", **changed("alone", _tcp("master", 20.0, 2)))
    assert _alone(events) == [("notice", ALONE, True),
                              ("notice", "ranks 0,1 connected after all: a process group was created late", False)]
    assert watcher.snapshot().diagnosis is None


def test_a_launch_whose_ranks_never_joined_a_group_failed_and_says_why_under_its_headline():
    # Issue 26/27: every rank exited 0, none ever joined a process group (each trained alone): a
    # failure, not "finished", however short the run (a run under the threshold has no notice).
    alone = LaunchResult([LaunchedRank(r, "master", r, exit=0) for r in range(2)], [NodeState("master", "exited")],
                         None, None, 41.0, notes=[f"hangwatch: {ALONE}"], alone=(0, 1))
    assert (alone.ok, alone.exit_code, alone.to_json()["alone"]) == (False, 1, [0, 1])
    lines = render(alone, 29500, "master").splitlines()
    assert lines[:2] == ["training failed: the 2 ranks exited with code 0, but none ever joined a process group: each "
                         "imported torch, ran not one collective (its Flight Recorder) and was seen with no TCP "
                         "connection to the store or a peer, so each trained alone (WORLD_SIZE 2; init_process_group "
                         "skipped?) (41.0 s)", f"  hangwatch: {ALONE}"]
    short = LaunchResult([LaunchedRank(r, "master", r, exit=0) for r in range(2)], [NodeState("master", "exited")],
                         None, None, 4.0, alone=(0, 1))
    assert render(short, 29500, "master").splitlines()[1] == "  rank 0 on master: exit code 0"
    finished = LaunchResult([LaunchedRank(r, "master", r, exit=0) for r in range(2)], [NodeState("master", "exited")],
                            None, None, 41.0)
    assert render(finished, 29500, "master").splitlines()[0] == \
        "training finished: all 2 ranks exited with code 0 (41.0 s)"


# -- the agent's side, on real processes -------------------------------------------------------

def test_the_agent_reads_rendezvous_where_the_watcher_does():
    assert store.RENDEZVOUS_FUNCTIONS == set(classify.RENDEZVOUS)
    stacks = [r["msg"] for r in _records("skip-init") if r["msg"]["type"] == "stacks" and r["msg"].get("id")]
    waiting = {int(pid): store.in_rendezvous(dump) for m in stacks[:2] for pid, dump in m["stacks"].items()}
    assert waiting == {4973: True, 4976: True, 4974: True, RANK3: False}
    assert not any(store.in_rendezvous(dump) for r in _records("leave") if r["msg"]["type"] == "stacks"
                   for dump in r["msg"]["stacks"].values())




JOINS_LATE = """
import datetime, os, pathlib, sys, time
import torch.distributed as dist
if os.environ["RANK"] == "2":
    while not pathlib.Path(sys.argv[1]).exists():
        time.sleep(0.1)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
dist.barrier()
print(f"joined {dist.get_rank()}", flush=True)
dist.destroy_process_group()
"""


def test_the_store_names_the_ranks_that_checked_in_and_reading_it_disturbs_nothing(tmp_path):
    script, go, port = tmp_path / "joins_late.py", tmp_path / "go", _free_port()
    script.write_text(JOINS_LATE)
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3",
                            "--master-addr", "127.0.0.1", "--master-port", str(port), str(script), str(go)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        deadline, said = time.monotonic() + 90, {}
        while said.get("checked_in") != [0, 1] and time.monotonic() < deadline:
            said = store.read(f"127.0.0.1:{port}", 3)
        assert said.get("checked_in") == [0, 1] and said["how"] == "list_keys", said
        go.touch()          # rank 2 joins: the ranks the store was read beside are unharmed
        out, _ = job.communicate(timeout=60)
    finally:
        job.kill()
    # The ranks share one pipe: their lines can run together.
    assert job.returncode == 0 and sorted(re.findall(r"joined (\d)", out)) == ["0", "1", "2"], out[-2000:]


def test_a_store_that_cannot_be_read_says_why_and_names_no_rank():
    said = store.read(f"127.0.0.1:{_free_port()}", 4)
    assert said["error"] and "checked_in" not in said and said["seconds"] < store.READ_TIMEOUT, said
    assert store.read(None, 4) == {"master": None, "world_size": 4, "error": "the rank's environment has no "
                                   "MASTER_ADDR (init_method given in the code?)"}


def test_each_ranks_established_connections_are_counted():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    talks = subprocess.Popen([sys.executable, "-c", "import socket, sys, time; s = socket.create_connection("
                              f"('127.0.0.1', {port})); print('up', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    alone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        peer, _ = listener.accept()
        assert talks.stdout.readline() == "up\n"
        assert agent.connections([talks.pid, alone.pid]) == {talks.pid: 1, alone.pid: 0}
        peer.close()
    finally:
        for p in (talks, alone):
            p.kill()
            p.wait()
        listener.close()


def test_a_runs_end_names_the_ranks_that_never_joined_a_group_and_only_those_that_imported_torch(tmp_path):
    # alone.jsonl to its end: every rank ended, none ever held a connection, each with torch
    # loaded. The one rule launch and attach end by (runs.never_connected); a rank without torch
    # (a script that only prints) is never one.
    from ddp_preflight.hangwatch import runs
    header, watcher, events = replay("alone", tmp_path)
    assert all(t.ended for t in watcher.state.ranks.values())
    assert watcher.never_connected() == (0, 1, 2, 3)
    next(t for t in watcher.state.ranks.values() if t.key == 2).torch = False
    assert runs.never_connected(watcher.state) == (0, 1, 3)


def test_the_verdict_at_a_runs_end_is_the_notice_said_or_one_made_for_a_run_too_short_for_it(tmp_path):
    from ddp_preflight.hangwatch import alone
    header, watcher, events = replay("alone", tmp_path)
    said = alone.at_end(watcher.state, 100.0, 1000.0)
    assert (said.kind, said.world, said.reason) == ("alone", 4, "training")      # the notice said at 8.7 s
    watcher.state.diagnosis = None            # derived: a run that ended before the notice
    made = alone.at_end(watcher.state, 100.0, 1000.0)
    assert (made.kind, made.world, made.reason, [e.rank for e in made.evidence]) == ("alone", 4, None, [0, 1, 2, 3])
    next(t for t in watcher.state.ranks.values() if t.key == 3).talked = True      # one did connect: no verdict
    assert alone.at_end(watcher.state, 100.0, 1000.0) is None


def test_a_launch_fails_only_on_ranks_whose_own_record_says_they_ran_no_collective(tmp_path):
    # Connections are counted each second: a short run's group can live between two counts. A
    # launch's ranks each record how many collectives they ran (the bootstrap's PID.end, from
    # their Flight Recorder); alone.jsonl was recorded without it (torchrun started by hand).
    from ddp_preflight.hangwatch import runs
    header, watcher, events = replay("alone", tmp_path)
    assert watcher.never_connected() == (0, 1, 2, 3) and watcher.ran_no_collective() == ()
    tracks = sorted(watcher.state.ranks.values(), key=lambda t: t.key)
    for t in tracks:
        t.ending = {"how": "returned", "code": 0, "collectives": 0}          # derived: as launched
    assert runs.ran_no_collective(watcher.state) == (0, 1, 2, 3)
    assert (watcher.alone_verdict().kind, watcher.alone_verdict().world) == ("alone", 4)
    tracks[1].ending = {"how": "returned", "code": 0, "collectives": 5}      # it ran some: a group existed
    assert runs.ran_no_collective(watcher.state) == (0, 2, 3)
    tracks[1].ending = {"how": "returned", "code": 0, "collectives": None}   # its recorder was off: not known
    assert runs.ran_no_collective(watcher.state) == (0, 2, 3)


def test_a_rank_whose_wait_in_init_process_group_uses_some_cpu_still_waits_there_while_one_never_checked_in(tmp_path):
    # CI's loaded box (two full runs here): a rank waiting in init_process_group used 3-9% of a core
    # (its store's polls), over the 5% a quiet rank uses; after its stack showed it there it was
    # "computing; working since its last stack", left out of the waiting ranks. The store says rank
    # 3 never checked in, so no rank can have left init_process_group: it is waiting there still.
    rank2 = next(r["msg"]["pid"] for r in _records("skip-init") if r["msg"]["type"] == "rank" and r["msg"]["rank"] == 2)
    first_stall_stack = min(r["at"] for r in _records("skip-init") if r["msg"]["type"] == "stacks" and r["msg"].get("id"))

    def polls(record):
        message = record["msg"]
        if record["node"] != "worker1" or message["type"] != "sample" or record["at"] <= first_stall_stack:
            return None
        return {**message, "ranks": [{**s, "cpu": 6.0} if s["pid"] == rank2 else s for s in message["ranks"]]}
    header, watcher, events = replay("skip-init", tmp_path, **changed("skip-init", polls))
    diagnosis = _diagnosis(events)
    assert (diagnosis.kind, diagnosis.culprits, diagnosis.reason, diagnosis.certainty) == \
        ("rendezvous-stall", [3], "never-checked-in", "certain")
    assert summary(diagnosis) == ("rank 3 never checked in (worker1's): it is idle at hang_train.py:65 (main); "
                                 "ranks 0,1,2 wait in init_process_group")
    waiting = next(e for e in diagnosis.evidence if e.rank == 2)
    assert waiting.notes[-1] == "used CPU since its stack, and cannot have left: its store holds 3 of 4 check-ins"


def test_a_rank_whose_place_went_stale_in_init_process_group_is_read_again_before_a_verdict_leaves_it_out(tmp_path):
    # When every rank has checked in (or the store is not read), nothing says a rank cannot have
    # left init_process_group. Full runs here (a firewall, 2 of 4): the ranks' shared connection
    # retries took one of them to 5% at the verdict's moment, and "ranks 0,2,3 wait" left it out.
    # Its stack is read again first. DERIVED: skip-init.jsonl with no store answer, and rank 2 at
    # 6% in its one sample between its stall stack (12.62 s) and the verdict (13.01 s as recorded).
    records = _records("skip-init")
    rank2 = next(r["msg"]["pid"] for r in records if r["msg"]["type"] == "rank" and r["msg"]["rank"] == 2)
    first_stall_stack = min(r["at"] for r in records if r["msg"]["type"] == "stacks" and r["msg"].get("id"))
    blips_end = 12.7
    unread = changed("skip-init", _stores(None))
    swaps = {}
    for record in records:
        message = record["msg"]
        if record["node"] == "worker1" and message["type"] == "sample" and first_stall_stack < record["at"] <= blips_end:
            swaps[(record["at"], record["node"])] = \
                {**message, "ranks": [{**s, "cpu": 6.0} if s["pid"] == rank2 else s for s in message["ranks"]]}
    then = unread["then"] + [(at, lambda w, node=node, message=message: w.receive(node, message))
                             for (at, node), message in swaps.items()]
    header, watcher, events = replay("skip-init", tmp_path, then=then,
                                     lost=lambda r: unread["lost"](r) or (r["at"], r["node"]) in swaps)
    # As it was: "not a hang: ranks 0,1 wait in init_process_group while rank 2 (worker1's) is
    # computing" at 13.0 s, a verdict from one sample at 6%.
    said = [(e.kind, e.text) for e in events if e.kind in ("diagnosis", "straggler")]
    assert [kind for kind, _ in said] == ["diagnosis"], said
    diagnosis = _diagnosis(events)
    assert summary(diagnosis) == ("ranks 0,1,2 wait in init_process_group; rank 3 is idle at hang_train.py:65 (main); "
                                 "the store was not read, so who never checked in cannot be told")
    assert (diagnosis.kind, diagnosis.culprits, diagnosis.certainty) == ("rendezvous-stall", [], "unsure")
    # Named with the next answers (24.5 s here: a replay answers no new ask; live, the ask made at
    # 13.0 s is answered within a second or two).


def _wire(node: str, after: float):
    """Every sample of `node`'s ranks from `after` on says their connections carried bytes (wire),
    while every count still says none (issue 35: a count that missed them on a loaded box)."""
    def change(record):
        message = record["msg"]
        if record["node"] != node or record["at"] < after or message["type"] != "sample" or not message["ranks"]:
            return None
        return {**message, "ranks": [{**s, "wire": 4096 * int(record["at"])} for s in message["ranks"]]}
    return change


def test_bytes_on_its_connections_exclude_training_alone_whatever_the_counts_say(tmp_path):
    # DERIVED from alone.jsonl: worker1's ranks' connections carry bytes from 8 s on (a healthy
    # 2-rank all_reduce), though each count of their connections says 0: never "each rank trains
    # alone" (before: said after the threshold, on the counts alone).
    header, watcher, events = replay("alone", tmp_path, **changed("alone", _wire("worker1", 8.0)))
    assert not _alone(events), [e.text for e in events]
    assert watcher.snapshot().diagnosis is None
