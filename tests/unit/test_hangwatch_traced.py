"""A rank another tracer holds (gdb, strace, a `py-spy record`): a process has one ptrace tracer,
so py-spy's attach fails with EPERM exactly as a missing permission does. The fix for a missing
permission (ptrace_scope, another user) is then wrong: the rank is read without suspending it,
and when even that fails, the tracer is named. A real tracer here: a process that PTRACE_SEIZEs
the rank (it does not stop it) and holds it."""

import os
import subprocess
import sys
import time

import pytest

from ddp_preflight.hangwatch.watch import Watcher, WatchTarget, local_py_spy
from ddp_preflight.node import proc, pyspy
from ddp_preflight.transport import LocalNode

RANK = """
import time
def waits_in_its_loop():
    print("ready", flush=True)
    time.sleep(120)
waits_in_its_loop()
"""

TRACER = """
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
if libc.ptrace(0x4206, int(sys.argv[1]), None, None) != 0:     # PTRACE_SEIZE: traced, not stopped
    print("errno", ctypes.get_errno(), flush=True)
    sys.exit(1)
print("holding", flush=True)
time.sleep(120)
"""

@pytest.fixture
def traced_rank():
    assert local_py_spy() is not None, "py-spy is one of the project's dependencies: pip install -e ."
    rank = subprocess.Popen([sys.executable, "-c", RANK], stdout=subprocess.PIPE, text=True)
    assert rank.stdout.readline().strip() == "ready"          # in its function, whatever the load
    tracer = subprocess.Popen([sys.executable, "-c", TRACER, str(rank.pid)], stdout=subprocess.PIPE, text=True)
    try:
        assert tracer.stdout.readline().strip() == "holding"
        assert proc.tracer(rank.pid) == tracer.pid
        yield rank, tracer
    finally:
        for p in (tracer, rank):
            p.kill()
            p.wait()


def test_a_rank_held_by_another_tracer_is_read_without_suspending_it(traced_rank):
    rank, _ = traced_rank
    # What py-spy says when it must suspend it: the same EPERM as a missing permission.
    blocking = subprocess.run([local_py_spy(), "dump", "--pid", str(rank.pid), "--json"], capture_output=True,
                              text=True, timeout=30)
    assert blocking.returncode != 0 and "EPERM" in blocking.stderr, blocking.stderr
    stack = pyspy.dump(local_py_spy(), rank.pid, False)
    assert isinstance(stack, list), stack
    main = pyspy.main_thread(stack)
    assert [f["name"] for f in main["frames"]][:2] == ["waits_in_its_loop", "<module>"], main["frames"]


def test_the_watch_reads_a_traced_rank_and_never_offers_the_ptrace_permission_fix(traced_rank, tmp_path):
    rank, _ = traced_rank
    events = []
    watcher = Watcher([WatchTarget(LocalNode("here", sys.executable), pids=(rank.pid,))], py_spy=local_py_spy(),
                      on_event=events.append, incident_dir=str(tmp_path / "incidents")).start()
    try:
        deadline = time.monotonic() + 60
        while not any(t.dump for t in watcher.state.ranks.values()):        # a stack was read
            assert time.monotonic() < deadline, [e.text for e in events]
            time.sleep(0.1)
    finally:
        watcher.close()
    notices = [e.text for e in events if e.kind == "notice"]
    assert not [n for n in notices if "ptrace" in n], notices


def test_a_stack_no_read_can_take_names_the_tracer_not_a_permission():
    from ddp_preflight.hangwatch import reducer
    from ddp_preflight.node import protocol
    # What the agent sends (node/pyspy.py) when even a read without suspending fails on a traced rank.
    state = reducer.new_state(["here"], reducer.Config())
    out = list(reducer.step(state, reducer.FromAgent("here", protocol.Hello(node="here", uid=os.geteuid())), 0.0, 1000.0))
    found = protocol.RankFound(pid=4242, rank=0, world_size=1, master="127.0.0.1:29500", uid=os.geteuid())
    out += reducer.step(state, reducer.FromAgent("here", found), 0.5, 1000.5)
    stacks = protocol.Stacks(t=1.0, stacks={4242: {"error": "traced by pid 77 (gdb)", "traced_by": 77, "tracer": "gdb"}})
    out += reducer.step(state, reducer.FromAgent("here", stacks), 1.0, 1001.0)
    texts = [e.event.text for e in out if isinstance(e, reducer.Say)]
    assert [t for t in texts if "traced" in t] == [
        "here: pid 4242 is traced by pid 77 (gdb): a process has one ptrace tracer, so its stack cannot be read "
        "while that one holds it (detach it to let hangwatch read it); watching CPU and /proc alone"], texts
    assert not [t for t in texts if "ptrace_scope" in t], texts
