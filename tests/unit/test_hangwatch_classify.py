"""Classify ranks and diagnose the hang from recorded real `py-spy dump --json` output."""

import json
from pathlib import Path

from ddp_preflight.hangwatch.classify import classify
from ddp_preflight.hangwatch.diagnose import diagnose
from ddp_preflight.hangwatch.text import summary

PYSPY = Path(__file__).parent / "artifacts" / "pyspy"


def seen(states):
    """The ranks' states as the evidence a verdict reads (a rank numbered below 0 is a pid)."""
    return {r: s.as_evidence("node", 100 + r if r >= 0 else -r, r if r >= 0 else None) for r, s in states.items()}


def dump(name):
    return json.loads((PYSPY / name).read_text())


def test_a_rank_blocked_in_all_reduce_is_in_that_collective_at_its_training_line():
    state = classify(dump("deadlock_rank0_all_reduce.json"), cpu_percent=0.0, wchan="futex_do_wait")
    assert state.state == "collective" and state.op == "all_reduce"
    assert state.frame.where == "hang.py:6" and state.frame.function == "train_step"
    assert any("futex_do_wait" in e for e in state.evidence)


def test_the_rank_that_left_the_loop_is_idle_elsewhere_with_its_line():
    state = classify(dump("deadlock_rank1_left_loop.json"), cpu_percent=0.0, wchan="hrtimer_nanosleep")
    assert state.state == "idle" and state.frame.where == "hang.py:11"


def test_the_deadlock_names_the_guilty_rank_and_its_line_not_the_victim():
    ranks = {0: classify(dump("deadlock_rank0_all_reduce.json"), 0.0, "futex_do_wait"),
             1: classify(dump("deadlock_rank1_left_loop.json"), 0.0, "hrtimer_nanosleep")}
    found = diagnose(seen(ranks))
    assert found.kind == "deadlock" and found.culprits == (1,)
    assert "rank 1 left the loop: idle at hang.py:11" in summary(found)
    assert "rank 0 waits in all_reduce" in summary(found)
    assert any("uneven data" in c.what for c in found.causes)


def test_a_busy_rank_makes_it_a_straggler_never_a_deadlock():
    busy = classify(dump("deadlock_rank1_left_loop.json"), cpu_percent=98.0)
    ranks = {0: classify(dump("deadlock_rank0_all_reduce.json"), 0.0), 1: busy}
    found = diagnose(seen(ranks))
    assert busy.state == "computing"
    assert found.kind == "straggler" and "not a hang" in summary(found) and found.culprits == (1,)


def test_an_exited_rank_and_unreadable_stacks_are_said_as_such():
    ranks = {0: classify(dump("deadlock_rank0_all_reduce.json"), 0.0), 1: classify(None, None, exit_code=-9)}
    found = diagnose(seen(ranks))
    assert found.kind == "exited" and found.culprits == (1,) and "exit code -9" in summary(found)
    assert classify(None, 0.0).state == "unknown"


def test_all_ranks_in_one_collective_is_a_network_stall():
    waiting = classify(dump("deadlock_rank0_all_reduce.json"), 0.0)
    found = diagnose(seen({0: waiting, 1: waiting}))
    assert found.kind == "network-stall" and "all_reduce" in summary(found)


def test_a_rank_in_torch_compile_is_compiling_at_its_own_line_not_a_library_line():
    state = classify(dump("compiling_torch_compile.json"), cpu_percent=97.0)
    assert state.state == "compiling"
    # The innermost frames are jinja2's and the standard library's: installed code, not the training's.
    assert state.frame.where == "comp.py:4"
    ranks = {0: state, 1: classify(dump("deadlock_rank0_all_reduce.json"), 0.0)}
    found = diagnose(seen(ranks))
    assert found.kind == "straggler" and found.culprits == (0,) and "compiling at comp.py:4" in summary(found)


def test_ranks_that_cannot_be_seen_are_not_blamed_when_a_seen_rank_left_the_loop():
    ranks = {0: classify(dump("deadlock_rank1_left_loop.json"), 0.0),
             1: classify(dump("deadlock_rank0_all_reduce.json"), 0.0),
             2: classify(None, None)}
    found = diagnose(seen(ranks))
    assert found.kind == "deadlock" and found.culprits == (0,)
    assert "rank 2 unknown (no stack" in summary(found)


def test_with_only_unseen_ranks_to_blame_there_is_no_culprit_and_no_hang():
    from ddp_preflight.hangwatch.classify import RankState
    waiting = classify(dump("deadlock_rank0_all_reduce.json"), 0.0)
    lost = RankState("unknown", evidence=("not watched: worker1's agent is gone",),
                     unseen="not watched: worker1's agent is gone")
    found = diagnose(seen({0: waiting, 2: waiting, 1: lost}))
    assert found.kind == "unseen" and found.culprits == ()
    assert summary(found) == ("ranks 0,2 wait in all_reduce; rank 1 unknown (not watched: worker1's agent is gone): "
                             "a hang cannot be told from a straggler")
    # A rank without a stack (no ptrace) is no culprit either; one without a rank number is named by pid.
    found = diagnose(seen({0: waiting, -4242: classify(None, 97.0)}))
    assert found.kind == "unseen" and found.culprits == () and "pid 4242 unknown (no stack" in summary(found)
    # Nobody waits in a collective, and the ranks not seen may be anywhere: said as seen, no hang.
    rendezvous = RankState("rendezvous", evidence=("in init_process_group",))
    found = diagnose(seen({0: rendezvous, 1: rendezvous, 2: lost, 3: lost}))
    assert found.kind == "unseen" and found.culprits == ()
    assert summary(found) == ("ranks 0,1: rendezvous; ranks 2,3 unknown (not watched: worker1's agent is gone): "
                             "a hang cannot be told from a straggler")


def test_a_rank_that_renamed_its_main_thread_is_read_from_its_main_thread():
    # threading.current_thread().name = "trainer": py-spy lists a sleeping helper thread first; the
    # main thread is the one whose OS thread id is the pid, whatever its name.
    native = classify(dump("native_renamed_main.json"), cpu_percent=0.0, wchan="futex_do_wait")
    assert (native.state, native.reason, native.frame.where) == ("idle", "waits-on-lock", "renamed_main.py:15")
    plain = classify(dump("python_renamed_main.json"), cpu_percent=0.0, wchan="futex_do_wait")
    assert (plain.state, plain.frame.where, plain.frame.function) == ("idle", "renamed_main.py:15", "<module>")


def test_a_rank_that_left_the_loop_and_is_behind_by_the_flight_recorder_has_uneven_data_said_once():
    # The recorded stacks (rank 2 left the loop) with the sequence numbers the recorded launch's
    # Flight Recorders gave (artifacts/explain/launch-leave: ranks 0,1,3 at all_reduce #12, rank 2 at
    # #11): the left loop's causes and the one behind's are the same uneven data, said once.
    from dataclasses import replace

    from ddp_preflight.hangwatch.words import cause_line
    waiting = classify(dump("deadlock_rank0_all_reduce.json"), 0.0, "futex_do_wait")
    left = classify(dump("deadlock_rank1_left_loop.json"), 0.0, "hrtimer_nanosleep")
    ranks = {r: replace(e, seq=11 if r == 2 else 12, seq_op="all_reduce")
             for r, e in seen({0: waiting, 1: waiting, 2: left, 3: waiting}).items()}
    found = diagnose(ranks)
    assert (found.kind, found.culprits, found.reason) == ("deadlock", (2,), "left-loop")
    lines = [cause_line(c) for c in found.causes]
    assert len(lines) == len(set(lines)) == 2, lines
    assert sum("drop_last=True" in line for line in lines) == 1, lines


# -- outside any collective: asleep in its loop, after it, or waiting on a connection --------------

BLOCKED = PYSPY / "blocked"


def _blocked(name):
    """A recording of blocked/, its frames pointing at the script beside it, marked by the agent's
    own reading of which lines sit inside a loop (node/loops.py)."""
    from ddp_preflight.node import loops
    record = json.loads((BLOCKED / f"{name}.json").read_text())
    for thread in record["dump"]:
        for frame in thread["frames"]:
            if frame["filename"].endswith(f"/{name}.py"):
                frame["filename"] = str(BLOCKED / f"{name}.py")
    loops.annotate(record["dump"])
    return record


def test_a_rank_asleep_inside_its_loop_sleeps_it_did_not_leave_the_loop():
    r = _blocked("sleeps_in_loop")
    state = classify(r["dump"], 0.0, r["wchan"], waits_in=r["waits_in"])
    assert (state.state, state.reason, state.frame.where) == ("idle", "sleeps", "sleeps_in_loop.py:7")
    assert "asleep in the kernel (nanosleep: time.sleep)" in state.evidence


def test_a_rank_asleep_after_its_loop_left_the_loop():
    r = _blocked("sleeps_after_loop")
    state = classify(r["dump"], 0.0, r["wchan"], waits_in=r["waits_in"])
    assert (state.state, state.reason, state.frame.where) == ("idle", "left-loop", "sleeps_after_loop.py:7")


def test_a_rank_reading_a_silent_server_waits_to_receive_on_that_connection():
    r = _blocked("waits_on_server")
    state = classify(r["dump"], 0.0, r["wchan"], waits_in=r["waits_in"])
    assert (state.state, state.reason, state.op, state.frame.where) == \
        ("idle", "waits-to-receive", r["waits_in"]["on"], "waits_on_server.py:6")
    assert r["waits_in"]["on"].startswith("tcp 127.0.0.1:")


def test_a_rank_blocked_where_its_wait_may_end_is_held_likely_and_says_what_it_is_blocked_in():
    # Asleep in its loop, or reading a socket: the wait may end by itself (a checkpoint, a
    # service's answer), so the others are held up by it, likely, never a certain deadlock (issue 35).
    from ddp_preflight.hangwatch.causes import CAUSES
    from ddp_preflight.hangwatch.model import Reason
    sleeping, server = _blocked("sleeps_in_loop"), _blocked("waits_on_server")
    for record, said, reason in ((sleeping, "rank 1 sleeps outside any collective: idle at sleeps_in_loop.py:7",
                                  Reason.SLEEPS),
                                 (server, f"rank 1 waits to receive on {server['waits_in']['on']} outside any "
                                          "collective: idle at waits_on_server.py:6", Reason.WAITS_TO_RECEIVE)):
        ranks = {0: classify(dump("deadlock_rank0_all_reduce.json"), 0.0, "futex_do_wait"),
                 1: classify(record["dump"], 0.0, record["wchan"], waits_in=record["waits_in"])}
        found = diagnose(seen(ranks))
        assert (found.kind, found.culprits, found.reason, found.certainty) == ("held", (1,), reason, "likely")
        assert not found.kind.is_hang
        assert said in summary(found), summary(found)
        assert found.causes == CAUSES[reason]          # its own, never uneven data's


def test_a_line_is_in_a_loop_by_the_file_itself_and_a_kernel_file_is_never_read(tmp_path):
    from ddp_preflight.node import loops
    assert loops.loop_lines(str(BLOCKED / "sleeps_in_loop.py")) == frozenset({6, 7})
    assert loops.loop_lines(str(BLOCKED / "sleeps_after_loop.py")) == frozenset({6})
    fake = tmp_path / "code.py"
    fake.symlink_to("/proc/kmsg")           # a name a process chose for its code
    assert loops.loop_lines(str(fake)) is None


def test_the_lines_that_wait_on_a_lock_if_they_wait_are_read_from_the_code(tmp_path):
    # node/loops.py: `X.acquire(...)` (a call over two lines counts on both) and `with X:` on a name
    # or attribute; `with open(...)`, a call's other method and a `with` on a call are not.
    from ddp_preflight.node import loops
    code = tmp_path / "train.py"
    code.write_text("import threading\n"                 # 1
                    "lock = threading.Lock()\n"           # 2
                    "lock.acquire()\n"                    # 3
                    "with lock:\n"                        # 4
                    "    pass\n"                          # 5
                    "with self_.mu, open('x') as f:\n"    # 6
                    "    pass\n"                          # 7
                    "with open('x') as f:\n"              # 8
                    "    pass\n"                          # 9
                    "work.wait()\n"                       # 10
                    "lock.acquire(\n"                     # 11
                    "    timeout=5)\n")                   # 12
    assert loops.lock_lines(str(code)) == frozenset({3, 4, 6, 11, 12})
    dump = [{"thread_id": 1, "frames": [{"name": "main", "filename": str(code), "line": 3},
                                        {"name": "main", "filename": str(code), "line": 10}]}]
    loops.annotate(dump)
    assert [f.get("waits_on") for f in dump[0]["frames"]] == ["lock", None]
    assert loops.lock_lines(str(tmp_path / "missing.py")) is None


def test_a_rank_importing_torch_dynamo_is_importing_it_at_its_own_line_not_compiling():
    # importing_torch_dynamo.json: a real dump of importing_script.py at its line 4 (`torch._dynamo`,
    # torch's lazy import, as DDP's constructor makes it), inside torch/_dynamo's module code under
    # Python's import machinery. On CI's loaded box rank 0 was there while the others waited in
    # DDP's first broadcast, and was said to be "compiling".
    state = classify(dump("importing_torch_dynamo.json"), cpu_percent=99.0)
    assert (state.state, state.op, state.frame.where) == ("importing", "torch._dynamo", "importing_script.py:4")
    ranks = {0: state, 1: classify(dump("deadlock_rank0_all_reduce.json"), 0.0)}
    found = diagnose(seen(ranks))
    assert (found.kind, found.culprits) == ("straggler", (0,))
    assert summary(found).startswith("not a hang: rank 1 waits in all_reduce while rank 0 is importing torch._dynamo "
                                     "at importing_script.py:4 (<module>)"), summary(found)


def test_a_module_of_the_trainings_own_that_trains_as_it_is_imported_is_not_importing():
    # importing_own_module.json: a real dump of import_runner.py, which imports trains_on_import.py
    # (beside it), a module that computes at its top level: it computes at its own line.
    state = classify(dump("importing_own_module.json"), cpu_percent=99.0)
    assert (state.state, state.op, state.frame.where) == ("computing", None, "trains_on_import.py:8")


def test_only_the_trainings_own_lines_are_read_for_loops_and_locks(tmp_path):
    # A rank importing torch stands in torch's largest files: parsing one held the agent's
    # interpreter for up to a second, its samples stopped, and the watcher called the node lost.
    # The watcher reads loops and locks of the training's own frames only (Frame.in_library).
    from ddp_preflight.node import loops
    code = "import threading\nlock = threading.Lock()\nfor _ in range(3):\n    lock.acquire()\n"
    installed = tmp_path / "lib" / "python3.11" / "site-packages" / "pkg" / "mod.py"
    stdlib = tmp_path / "usr" / "lib" / "python3.11" / "queue.py"
    own = tmp_path / "train.py"
    for path in (installed, stdlib, own):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
    dump = [{"thread_id": 1, "frames": [{"name": "f", "filename": str(path), "line": 4}
                                        for path in (installed, stdlib, own)]}]
    loops.annotate(dump)
    assert [(f.get("in_loop"), f.get("waits_on")) for f in dump[0]["frames"]] == \
        [(None, None), (None, None), (True, "lock")]
    assert {key[0] for key in loops._cache} & {str(installed), str(stdlib)} == set()      # never parsed


def test_a_rank_reading_its_stdin_is_named_reading_stdin_and_held_never_a_left_loop():
    # reads_stdin: sys.stdin.readline() in its loop, its stdin a pipe nobody writes (issue 35: said
    # "left the loop ... (certain)", uneven data its cause, while its wchan said anon_pipe_read).
    from ddp_preflight.hangwatch.model import Reason
    r = _blocked("reads_stdin")
    state = classify(r["dump"], 0.0, r["wchan"], waits_in=r["waits_in"])
    assert (state.state, state.reason, state.op, state.frame.where) == \
        ("idle", "waits-to-receive", "stdin (a pipe)", "reads_stdin.py:6")
    # Its system call unread (another user's rank, no ptrace): the kernel's wait channel says it.
    unread = classify(r["dump"], 0.0, r["wchan"], waits_in=None)
    assert (unread.state, unread.reason, unread.op) == ("idle", "waits-to-receive", "a pipe")
    for one in (state, unread):
        ranks = {0: classify(dump("deadlock_rank0_all_reduce.json"), 0.0, "futex_do_wait"), 1: one}
        found = diagnose(seen(ranks))
        assert (found.kind, found.culprits, found.reason, found.certainty) == \
            ("held", (1,), Reason.WAITS_TO_RECEIVE, "likely")
        assert summary(found).startswith(f"rank 1 waits to receive on {one.op} outside any collective: idle at "
                                         "reads_stdin.py:6 (<module>); rank 0 waits in all_reduce; likely a stall"), \
            summary(found)


def test_a_rank_idle_inside_its_loop_with_its_wait_unread_has_not_left_the_loop():
    # The soak (bench/soak.py, issue 35): a straggler asleep at its loop's time.sleep, read in a sample
    # whose system call was not read (py-spy held it), was "DEADLOCK: rank 1 left the loop" (certain)
    # and --stop-on-hang stopped the healthy run. Inside its loop and its wait unknown: it may go on.
    from ddp_preflight.hangwatch.model import Reason
    r = _blocked("sleeps_in_loop")
    state = classify(r["dump"], 0.0, None, waits_in=None)
    assert (state.state, state.reason, state.frame.where) == ("idle", "idle-in-loop", "sleeps_in_loop.py:7")
    ranks = {0: classify(dump("deadlock_rank0_all_reduce.json"), 0.0, "futex_do_wait"), 1: state}
    found = diagnose(seen(ranks))
    assert (found.kind, found.culprits, found.reason, found.certainty) == ("held", (1,), Reason.IDLE_IN_LOOP, "likely")
    assert summary(found).startswith("rank 1 is idle inside its loop, outside any collective: idle at "
                                     "sleeps_in_loop.py:7 (train); rank 0 waits in all_reduce; likely a stall"), \
        summary(found)
    # After its loop, the same unread wait: it left the loop (certain), as before.
    after = _blocked("sleeps_after_loop")
    assert classify(after["dump"], 0.0, None, waits_in=None).reason == "left-loop"


def test_a_kept_answer_is_the_answer_classified_afresh_for_every_recorded_stack_and_cpu():
    # classify keeps its answers by what it reads (issue 36: a stall's ranks share a few stacks).
    # Over every stack the lab's agents recorded, at CPU figures either side of busy and of a
    # whole percent, with and without a kernel wait: the kept answer is the fresh one, and asking
    # twice gives the same.
    import json
    from pathlib import Path

    from ddp_preflight.hangwatch import classify as c

    stacks = []
    for recording in sorted((Path(__file__).parent / "artifacts" / "agent").glob("*.jsonl")):
        for line in recording.read_text().splitlines()[1:]:
            msg = json.loads(line)["msg"]
            if msg["type"] == "stacks":
                stacks += [d for d in msg["stacks"].values() if isinstance(d, list)]
    assert len(stacks) > 20
    c._kept.clear()
    answers = set()
    for dump in stacks:
        for cpu in (None, 0.0, 4.4, 4.6, 5.0, 97.0):
            for wchan in (None, "futex_do_wait"):
                fresh = c._classify(dump, cpu, wchan)
                assert c.classify(dump, cpu, wchan) == fresh == c.classify(dump, cpu, wchan, frames=c.frames_of(dump))
                answers.add((fresh.state, fresh.evidence))
    assert len(answers) > 10          # the stacks differ: the keys tell them apart
