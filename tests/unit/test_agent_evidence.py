"""What the agent reads of each rank beyond its CPU and state, from the kernel: when it started,
the bytes it moves, its helpers' CPU, its sockets' queues, and at its end the node's OOM kills,
its output file's last lines and its own record of how its script ended. Real processes, files,
pipes, terminals, sockets and (as root) a real OOM kill in a memory cgroup, read by the real agent
(node/agent.py) in this process, or by its keeper (node/keeper.py) where a value is exact only
with a clock the test holds: a process stopped (SIGSTOP) between two readings does nothing, so
what it did between them is known to the byte."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ddp_preflight.node import agent as agent_module
from ddp_preflight.node import flight, keeper, proc, protocol, rank_bootstrap

ROOT = Path(__file__).parents[2]


# -- helpers ----------------------------------------------------------------------------------

def _agent(pids, messages, interval=0.2):
    """The real agent, in this process, watching `pids`; its messages (as the watcher parses
    them: through JSON) go to `messages`."""
    spec = {"program": "agent", "node": "here", "pids": pids, "interval": interval, "stack_every": 3600.0}
    a = agent_module.Agent(spec)
    a.emit = lambda m: messages.append(json.loads(protocol.line("", m)))
    threading.Thread(target=a.run, daemon=True).start()
    return a


def _wait(predicate, what, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(what)


def _typed(messages, kind, pid):
    return [protocol.agent_message(m) for m in list(messages) if m.get("type") == kind and m.get("pid") == pid]


def _exit_of(messages, pid) -> protocol.RankExit:
    return _wait(lambda: next(iter(_typed(messages, "exit", pid)), None), f"no exit message for {pid}")


def _samples(messages, pid) -> list[protocol.RankSample]:
    return [r for m in list(messages) if m.get("type") == "sample"
            for r in protocol.agent_message(m).ranks if r.pid == pid]


def _sampled(messages, pid, count=1):
    """Wait until the rank was announced and sampled `count` times since."""
    _wait(lambda: _typed(messages, "rank", pid), f"{pid} never found")
    return _wait(lambda: len(_samples(messages, pid)) >= count and _samples(messages, pid), f"{pid} never sampled")


def _stopped(pid, timeout=10.0):
    """Wait until the process is stopped (SIGSTOP): it does nothing until SIGCONT."""
    _wait(lambda: (proc.stat(pid) or proc.Stat("X", 0, 0, 0, None)).state == "T", f"{pid} never stopped", timeout)


def _stats():
    return {pid: st for pid, st in ((p, proc.stat(p)) for p in proc.pids()) if st is not None}


def _end(*processes):
    for p in processes:
        if p.poll() is None:
            p.kill()
        p.wait()


def _fds_on(target: os.stat_result) -> list[int]:
    """This process's descriptors open on the same object (device and inode) as `target`."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            st = os.stat(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
            out.append(int(name))
    return out


TRIGGERED = """
import os, sys, time
trigger = sys.argv[1]
while not os.path.exists(trigger):
    time.sleep(0.02)
"""


# -- 1. when it started -----------------------------------------------------------------------

def test_a_ranks_start_is_the_boot_time_plus_its_start_ticks_on_this_clock():
    before = time.time()
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    after = time.time()
    messages: list = []
    a = _agent([rank.pid], messages)
    try:
        [found] = _wait(lambda: _typed(messages, "rank", rank.pid), "never found")
        assert found.started == proc.boot_time() + proc.stat(rank.pid).start_ticks / proc.TICK
        # btime is whole seconds (cut, not rounded) and ticks are 1/TICK s: at most a second early.
        assert before - 1.0 - 1 / proc.TICK <= found.started <= after + 1 / proc.TICK, (before, found.started, after)
    finally:
        a.stop.set()
        _end(rank)


def test_the_agent_says_which_ranks_imported_torch_with_their_connections():
    # A rank that never joins a process group "trains alone" only if it is a torch program at all
    # (hangwatch/alone.py): a script that only prints is none.
    ready = ("import sys, time; import torch; print('up', flush=True); time.sleep(60)",
             "import sys, time; print('up', flush=True); time.sleep(60)")
    ranks = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for code in ready]
    messages: list = []
    try:
        assert [r.stdout.readline() for r in ranks] == ["up\n", "up\n"]
        a = _agent([r.pid for r in ranks], messages)
        counted = lambda pid: [s.torch for s in _samples(messages, pid) if s.tcp is not None]   # noqa: E731
        _wait(lambda: all(counted(r.pid) for r in ranks), "no connection count")
        assert [counted(r.pid)[0] for r in ranks] == [True, False]
        assert all(s.torch is None for s in _samples(messages, ranks[0].pid) if s.tcp is None)   # read with the count
        a.stop.set()
    finally:
        _end(*ranks)


# -- 2. bytes read and written ----------------------------------------------------------------

WRITES_ONCE = """
import os, signal
out = os.open('/dev/null', os.O_WRONLY)
os.kill(os.getpid(), signal.SIGSTOP)
os.write(out, b'x' * 1_000_000)            # between the two stops: exactly this, nothing else
os.kill(os.getpid(), signal.SIGSTOP)
signal.pause()
"""


def test_io_is_what_the_rank_read_and_wrote_between_two_samples_per_second_to_the_byte():
    rank = subprocess.Popen([sys.executable, "-c", WRITES_ONCE])
    try:
        _stopped(rank.pid)
        kept = keeper.Keeper()
        kept.found(rank.pid)
        stats = _stats()
        assert "io" not in kept.sample(rank.pid, 100.0, stats, keeper.children_of(stats))     # the first: no rate yet
        first = proc.io_bytes(rank.pid)
        os.kill(rank.pid, signal.SIGCONT)
        # SIGCONT wakes it before kill() returns, but it may write and stop again before this
        # process runs next: its second stop is told by the bytes, not by a state seen between.
        _stopped(rank.pid)
        assert proc.io_bytes(rank.pid) == first + 1_000_000
        assert kept.sample(rank.pid, 102.0, stats, keeper.children_of(stats))["io"] == 500_000.0   # over 2 s
        kept.forget({})
    finally:
        _end(rank)


def test_the_agent_sends_no_io_in_a_ranks_first_sample_and_zero_while_it_is_stopped():
    rank = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSTOP)"])
    messages: list = []
    try:
        _stopped(rank.pid)
        a = _agent([rank.pid], messages)
        samples = _sampled(messages, rank.pid, 4)
        assert samples[0].io is None
        assert [s.io for s in samples[1:4]] == [0.0, 0.0, 0.0]
        assert [s.state for s in samples[:4]] == ["T"] * 4
    finally:
        a.stop.set()
        _end(rank)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a reader as another user")
def test_io_bytes_is_none_for_another_users_process_and_for_a_gone_one():
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert isinstance(proc.io_bytes(rank.pid), int)
        assert _as_nobody(lambda: proc.io_bytes(rank.pid)) == "None"
    finally:
        _end(rank)
    assert proc.io_bytes(rank.pid) is None


def _as_nobody(read) -> str:
    """What `read()` gives in a child of this process that is user nobody (as an agent that is not
    root reads another user's rank)."""
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(r)
            os.setgid(65534)
            os.setuid(65534)
            os.write(w, repr(read()).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        said = f.read()
    os.waitpid(child, 0)
    return said


# -- 3. its helpers' CPU ----------------------------------------------------------------------

FAMILY = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGCHLD, signal.SIG_IGN)      # its children are reaped by the kernel: no zombie
spin = 'import time\\nwhile True: pass'
# A worker that spins, through a shell (a grandchild), and a helper that sleeps.
shell = subprocess.Popen(['sh', '-c', 'exec "$0" -c "$1"', sys.executable, spin])
sleeper = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])
print(shell.pid, sleeper.pid, flush=True)
time.sleep(600)
"""


def test_children_cpu_is_its_descendants_cpu_since_the_last_sample_and_the_dead_drop_out():
    rank = subprocess.Popen([sys.executable, "-c", FAMILY], stdout=subprocess.PIPE, text=True)
    spinner, sleeper = (int(p) for p in rank.stdout.readline().split())
    try:
        # Both stopped while their CPU is read: the sleeper may still be starting its interpreter
        # (seen once: one tick of it between the test's reading and the sample's).
        for pid in (spinner, sleeper):
            os.kill(pid, signal.SIGSTOP)
            _stopped(pid)
        kept = keeper.Keeper()
        kept.found(rank.pid)
        stats = _stats()
        assert sorted(keeper.descendants(rank.pid, keeper.children_of(stats))) == sorted([spinner, sleeper])
        assert "children_cpu" not in kept.sample(rank.pid, 100.0, stats, keeper.children_of(stats))
        before = proc.stat(spinner).cpu_seconds + proc.stat(sleeper).cpu_seconds
        os.kill(spinner, signal.SIGCONT)
        time.sleep(0.5)
        os.kill(spinner, signal.SIGSTOP)
        _stopped(spinner)
        used = proc.stat(spinner).cpu_seconds + proc.stat(sleeper).cpu_seconds - before
        assert used > 0
        stats = _stats()
        assert kept.sample(rank.pid, 101.0, stats, keeper.children_of(stats))["children_cpu"] == round(100 * used, 1)
        # The worker dies (the kernel reaps it): it drops out, and the sleeper used nothing.
        os.kill(spinner, signal.SIGKILL)
        _wait(lambda: proc.stat(spinner) is None, "the worker was not reaped")
        stats = _stats()
        assert kept.sample(rank.pid, 102.0, stats, keeper.children_of(stats))["children_cpu"] == 0.0
        kept.forget({})
    finally:
        _end(rank)
        for pid in (spinner, sleeper):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


HELPER_BETWEEN_STOPS = """
import os, signal, subprocess, sys
os.kill(os.getpid(), signal.SIGSTOP)
# Between the two stops: a helper that spins 0.3 s and is waited for (a per-batch subprocess).
subprocess.run([sys.executable, '-c', 'import time\\nwhile time.process_time() < 0.3: pass'])
os.kill(os.getpid(), signal.SIGSTOP)
signal.pause()
"""


def test_a_helper_that_lived_and_ended_between_two_samples_counts_in_children_cpu():
    rank = subprocess.Popen([sys.executable, "-c", HELPER_BETWEEN_STOPS])
    try:
        _stopped(rank.pid)
        kept = keeper.Keeper()
        kept.found(rank.pid)
        stats = _stats()
        assert "children_cpu" not in kept.sample(rank.pid, 100.0, stats, keeper.children_of(stats))
        before = proc.stat(rank.pid).children_seconds
        os.kill(rank.pid, signal.SIGCONT)
        _wait(lambda: proc.stat(rank.pid).children_seconds > before and proc.stat(rank.pid).state == "T",
              "the helper never ran")
        used = proc.stat(rank.pid).children_seconds - before
        assert used >= 0.2
        stats = _stats()
        assert kept.sample(rank.pid, 101.0, stats, keeper.children_of(stats))["children_cpu"] == round(100 * used, 1)
        kept.forget({})
    finally:
        _end(rank)


def test_the_agent_sends_children_cpu_only_for_a_rank_with_descendants():
    lonely = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    parent = subprocess.Popen([sys.executable, "-c", """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, '-c', 'import os, signal; os.kill(os.getpid(), signal.SIGSTOP)'])
print(child.pid, flush=True)
time.sleep(60)
"""], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    _stopped(child)
    messages: list = []
    a = _agent([lonely.pid, parent.pid], messages)
    try:
        _sampled(messages, lonely.pid, 4)
        samples = _sampled(messages, parent.pid, 4)
        assert all(s.children_cpu is None for s in _samples(messages, lonely.pid))
        assert samples[0].children_cpu is None                  # the first: no rate yet
        assert [s.children_cpu for s in samples[1:4]] == [0.0, 0.0, 0.0]    # its one child is stopped
    finally:
        a.stop.set()
        _end(lonely, parent)
        os.kill(child, signal.SIGKILL)


# -- 4. the node's OOM kills ------------------------------------------------------------------

def _memory_cgroup(tmp_name: str, limit: int):
    """A memory cgroup limited to `limit` bytes, no swap (v1 or v2): its folder; None where this
    user cannot make one."""
    if os.geteuid() != 0:
        return None
    v2 = Path("/sys/fs/cgroup")
    if "memory" in (v2 / "cgroup.subtree_control").read_text().split() if (v2 / "cgroup.subtree_control").exists() \
            else False:
        folder, limits = v2 / tmp_name, {"memory.max": str(limit), "memory.swap.max": "0"}
    elif Path("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists():
        folder = Path("/sys/fs/cgroup/memory") / tmp_name
        limits = {"memory.limit_in_bytes": str(limit), "memory.memsw.limit_in_bytes": str(limit)}
    else:
        return None
    try:
        folder.mkdir()
    except OSError:
        return None
    for name, value in limits.items():
        try:
            (folder / name).write_text(value)
        except OSError:
            if name in ("memory.max", "memory.limit_in_bytes"):
                folder.rmdir()
                return None
    return folder


def test_oom_kills_is_the_kernels_count():
    line = next((line for line in Path("/proc/vmstat").read_text().splitlines() if line.startswith("oom_kill ")), None)
    assert proc.oom_kills() == (int(line.split()[1]) if line else None)


def test_a_rank_the_oom_killer_ends_is_said_to_be_one_and_a_rank_that_exits_is_not(tmp_path: Path):
    # The kernel counts an OOM kill before its victim is gone: measured here, 15-40 ms for a
    # 64 MiB process, 70-90 ms for 1 GiB, 140-900 ms for 2 GiB. Samples every 50 ms fall in between:
    # the count they read must not hide the kill (before the agent kept the count from before
    # the victim's SIGKILL, 8 of 8 such kills of a 2 GiB rank read oom False).
    group = _memory_cgroup(f"ddp-preflight-test-{os.getpid()}", 1 << 30)
    if group is None:
        pytest.skip("needs root and a memory cgroup this user can make")
    eater = subprocess.Popen([sys.executable, "-c", TRIGGERED + f"""
open({str(group / 'cgroup.procs')!r}, 'w').write(str(os.getpid()))
hog = []
while True:
    hog.append(bytearray(16 << 20))     # over its cgroup's 1 GiB: the OOM killer ends it
"""[1:], str(tmp_path / "eat")])
    leaver = subprocess.Popen([sys.executable, "-c", TRIGGERED + "sys.exit(3)\n", str(tmp_path / "leave")])
    messages: list = []
    a = _agent([eater.pid, leaver.pid], messages, interval=0.05)
    try:
        _sampled(messages, eater.pid, 2)
        _sampled(messages, leaver.pid, 2)
        (tmp_path / "leave").touch()
        left = _exit_of(messages, leaver.pid)
        assert (left.code, left.oom) == (3 << 8, False)
        before = proc.oom_kills()
        (tmp_path / "eat").touch()
        killed = _exit_of(messages, eater.pid)
        assert proc.oom_kills() == before + 1
        assert (killed.code, killed.oom) == (signal.SIGKILL, True), killed
    finally:
        a.stop.set()
        _end(eater, leaver)
        _wait(lambda: not (group / "cgroup.procs").read_text().strip(), "the cgroup did not empty")
        group.rmdir()


# -- 5. its output, when that is a file -------------------------------------------------------

THREE_LINES = TRIGGERED + """
print('epoch 1 loss 0.5')
sys.stderr.write('Traceback (most recent call last):\\n')
sys.stderr.write('ValueError: bad shard 7\\n')
sys.exit(1)
"""


def test_a_ranks_output_file_gives_exactly_its_last_lines_once_even_when_its_path_is_swapped(tmp_path: Path):
    log, secret = tmp_path / "rank.log", tmp_path / "secret"
    secret.write_text("root's secret\n")
    with log.open("w") as out:
        rank = subprocess.Popen([sys.executable, "-c", THREE_LINES, str(tmp_path / "go")], stdout=out, stderr=out)
    messages: list = []
    a = _agent([rank.pid], messages)
    try:
        _sampled(messages, rank.pid, 2)
        # The log's name now leads elsewhere: what is read is the rank's own open file, not the name.
        log.rename(tmp_path / "rank.log.moved")
        log.symlink_to(secret)
        (tmp_path / "go").touch()
        said = _exit_of(messages, rank.pid)
        assert said.output == ("epoch 1 loss 0.5", "Traceback (most recent call last):", "ValueError: bad shard 7")
        assert said.code == 1 << 8
        _wait(lambda: rank.pid not in a.keeper.kept, "its file is still held")
    finally:
        a.stop.set()
        _end(rank)


def test_stdout_and_stderr_in_two_files_give_stdouts_lines_then_stderrs_each_its_last_16_kib(tmp_path: Path):
    script = TRIGGERED + """
for i in range(2000):
    print('out %04d' % i)               # 9 bytes a line: the last 16 KiB hold the last 1820
sys.stdout.flush()
sys.stderr.write('err one\\nerr two\\n')
"""
    with (tmp_path / "out.log").open("w") as out, (tmp_path / "err.log").open("w") as err:
        rank = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "go")], stdout=out, stderr=err)
    messages: list = []
    a = _agent([rank.pid], messages)
    try:
        _sampled(messages, rank.pid, 2)
        (tmp_path / "go").touch()
        said = _exit_of(messages, rank.pid)
        assert said.output == tuple(f"out {i:04d}" for i in range(1942, 2000)) + ("err one", "err two")
        assert said.code == 0
    finally:
        a.stop.set()
        _end(rank)


def test_a_pipe_a_fifo_a_socket_or_a_terminal_is_never_opened_and_every_line_still_reaches_its_reader(tmp_path):
    lines = "".join(f"line {i}\n" for i in range(200))
    script = TRIGGERED + f"sys.stdout.write({lines!r}); sys.stdout.flush()\n"
    read_end, write_end = os.pipe()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    fifo_reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    fifo_writer = os.open(fifo, os.O_WRONLY)
    mine, theirs = socket.socketpair()
    terminal, terminal_side = os.openpty()
    outputs = {"pipe": write_end, "fifo": fifo_writer, "socket": theirs.fileno(), "terminal": terminal_side}
    objects = {kind: os.fstat(fd) for kind, fd in outputs.items()}
    ranks = {kind: subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "go")], stdout=fd, stderr=fd)
             for kind, fd in outputs.items()}
    for fd in (write_end, fifo_writer, terminal_side):
        os.close(fd)
    theirs.close()
    held = {kind: _fds_on(st) for kind, st in objects.items()}     # the test's own ends only
    messages: list = []
    a = _agent([p.pid for p in ranks.values()], messages)
    try:
        for p in ranks.values():
            _sampled(messages, p.pid, 3)
        assert {kind: _fds_on(st) for kind, st in objects.items()} == held
        assert all(p.pid in a.keeper.kept and a.keeper.kept[p.pid].outputs == [] for p in ranks.values())
        (tmp_path / "go").touch()
        for p in ranks.values():
            assert _exit_of(messages, p.pid).output == ()
        os.set_blocking(fifo_reader, True)
        mine.shutdown(socket.SHUT_WR)
        got = {"pipe": os.fdopen(read_end).read(), "fifo": os.fdopen(fifo_reader).read(),
               "socket": mine.makefile().read()}
        terminal_text = b""
        while terminal_text.count(b"\n") < 200:
            terminal_text += os.read(terminal, 65536)
        got["terminal"] = terminal_text.decode().replace("\r\n", "\n")
        assert got == {kind: lines for kind in outputs}
    finally:
        a.stop.set()
        _end(*ranks.values())
        mine.close()
        os.close(terminal)


def test_no_output_file_stays_open_after_its_rank_is_gone_whatever_way_it_went(tmp_path: Path):
    logs = [tmp_path / f"rank{i}.log" for i in range(12)]
    ranks = []
    for i, log in enumerate(logs):
        with log.open("w") as out:
            code = "import os, signal; os.kill(os.getpid(), signal.SIGSTOP)" if i % 3 == 0 else \
                "import time; print('up', flush=True); time.sleep(600)"
            ranks.append(subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT))
    inodes = {log.stat().st_ino for log in logs}

    def held():
        return sorted(ino for fd in os.listdir("/proc/self/fd") for ino in [_inode(fd)] if ino in inodes)

    messages: list = []
    a = _agent([p.pid for p in ranks], messages)
    try:
        for p in ranks:
            _sampled(messages, p.pid, 2)
        assert held() == sorted(inodes)                   # one descriptor per rank's file, no more
        for i, p in enumerate(ranks):
            if i % 3 == 0:
                # Once it has stopped itself (the kernel's state T): a SIGCONT sent before its
                # SIGSTOP (a slow start on a loaded box) would leave it stopped for good.
                _wait(lambda p=p: getattr(proc.stat(p.pid), "state", None) == "T", f"{p.pid} never stopped itself")
                os.kill(p.pid, signal.SIGCONT)             # it ends by itself (its script returns)
            elif i % 3 == 1:
                p.terminate()
            else:
                p.kill()
        for p in ranks:
            _exit_of(messages, p.pid)
        _wait(lambda: not held(), f"output files still open: {held()}")
        assert not any(p.pid in a.keeper.kept for p in ranks)
    finally:
        a.stop.set()
        _end(*ranks)
    # A rank forgotten without an exit seen (the agent's thread missed it) lets go of its file too.
    with logs[0].open("w") as out:
        rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], stdout=out)
    try:
        kept = keeper.Keeper()
        kept.found(rank.pid)
        assert held() == [logs[0].stat().st_ino]
        kept.forget({})
        assert held() == [] and kept.kept == {}
    finally:
        _end(rank)


def _inode(fd: str):
    try:
        return os.stat(f"/proc/self/fd/{fd}").st_ino
    except OSError:
        return None


# -- 6. its own record of how its script ended ------------------------------------------------

def _bootstrapped(tmp_path: Path, body: str, folder: Path | None):
    script = tmp_path / "train.py"
    script.write_text(TRIGGERED.replace("sys.argv[1]", repr(str(tmp_path / "go"))) + body)
    env = {k: v for k, v in os.environ.items() if k != rank_bootstrap.FOLDER_VARIABLE}
    if folder is not None:
        env[rank_bootstrap.FOLDER_VARIABLE] = str(folder)
    return subprocess.Popen([sys.executable, "-u", rank_bootstrap.__file__, str(script)], env=env,
                            stderr=subprocess.DEVNULL)


def test_a_ranks_record_of_sys_exit_is_sent_with_its_exit_and_removed(tmp_path: Path):
    folder = tmp_path / "fr"
    folder.mkdir(mode=0o700)
    rank = _bootstrapped(tmp_path, "sys.exit(3)\n", folder)
    messages: list = []
    a = _agent([rank.pid], messages)
    try:
        _sampled(messages, rank.pid, 2)
        (tmp_path / "go").touch()
        said = _exit_of(messages, rank.pid)
        assert said.code == 3 << 8
        assert {k: said.ending[k] for k in ("how", "code", "pid")} == {"how": "exit", "code": 3, "pid": rank.pid}
        assert not (folder / f"{rank.pid}.end").exists()           # read once: a pid is reused
    finally:
        a.stop.set()
        _end(rank)


def test_the_record_is_read_in_the_users_own_folder_when_the_rank_names_none(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(flight, "FOLDER_PREFIX", str(tmp_path / "hangwatch-fr-"))
    folder = tmp_path / f"hangwatch-fr-{os.geteuid()}"
    folder.mkdir(mode=0o700)
    # As a script that imported hangwatch.flight records its end: in its user's folder, at exit.
    rank = subprocess.Popen([sys.executable, "-c", TRIGGERED + f"""
from ddp_preflight.node.rank_bootstrap import record_ending
record_ending({str(folder)!r}, "ended")
"""[1:], str(tmp_path / "go")], cwd=ROOT, env={k: v for k, v in os.environ.items() if k != rank_bootstrap.FOLDER_VARIABLE})
    messages: list = []
    a = _agent([rank.pid], messages)
    try:
        _sampled(messages, rank.pid, 2)
        (tmp_path / "go").touch()
        ending = _exit_of(messages, rank.pid).ending
        assert {k: ending[k] for k in ("how", "pid", "code")} == {"how": "ended", "pid": rank.pid, "code": None}
        assert list(folder.iterdir()) == []
    finally:
        a.stop.set()
        _end(rank)


@pytest.mark.parametrize("fault", ["others may write the folder", "the folder is a symlink", "the record is a symlink",
                                   "the record is a FIFO", "the record is not a dict"])
def test_a_record_that_must_not_be_read_or_is_not_a_dict_gives_none(tmp_path: Path, fault):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    folder = real if fault != "the folder is a symlink" else tmp_path / "link"
    if fault == "the folder is a symlink":
        folder.symlink_to(real)
    if fault == "others may write the folder":
        os.chmod(real, 0o777)
    rank = subprocess.Popen([sys.executable, "-c", TRIGGERED, str(tmp_path / "go")],
                            env={**os.environ, rank_bootstrap.FOLDER_VARIABLE: str(folder)})
    secret = tmp_path / "secret.json"
    secret.write_text('{"how": "exit", "code": 0}')
    record = real / f"{rank.pid}.end"
    if fault == "the record is a symlink":
        record.symlink_to(secret)
    elif fault == "the record is a FIFO":
        os.mkfifo(record)
    else:
        record.write_text("[1, 2]" if fault == "the record is not a dict" else '{"how": "exit", "code": 3}')
    messages: list = []
    a = _agent([rank.pid], messages)
    try:
        _sampled(messages, rank.pid, 2)
        started = time.monotonic()
        (tmp_path / "go").touch()
        said = _exit_of(messages, rank.pid)
        assert said.ending is None and said.code == 0
        assert time.monotonic() - started < 5           # a FIFO never blocks the read
        assert secret.read_text() == '{"how": "exit", "code": 0}'
    finally:
        a.stop.set()
        _end(rank)


# -- 7. its sockets' queues, with the stacks ---------------------------------------------------

def _settled(pids):
    """Wait until the ranks' queues stay the same for 0.2 s (the kernel is done moving bytes)."""
    last = None
    for _ in range(100):
        now = agent_module.socket_queues(pids)
        if now == last:
            return
        last = now
        time.sleep(0.2)
    raise AssertionError(f"the queues never settled: {last}")


def _stacks(a, messages, request) -> protocol.Stacks:
    """The stacks message the watcher's request `request` gets (the agent also takes its own)."""
    a.stacks(request_id=request)
    return next(s for s in map(protocol.agent_message, [m for m in messages if m.get("type") == "stacks"])
                if s.id == request)


def test_socket_queues_count_unread_bytes_and_connections_the_peer_closed_exactly():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    rank = subprocess.Popen([sys.executable, "-c", f"""
import socket, time
conns = [socket.create_connection(('127.0.0.1', {port})) for _ in range(3)]
print('connected', flush=True)
time.sleep(60)
"""], stdout=subprocess.PIPE, text=True)
    rank.stdout.readline()
    peers = [server.accept()[0] for _ in range(3)]
    ends = [f"127.0.0.1:{p.getpeername()[1]}" for p in peers]      # the rank's own end of each
    peers[0].sendall(b"a" * 1000)
    peers[1].sendall(b"b" * 2345)
    peers[2].close()                   # the rank's side of it: CLOSE_WAIT, until the rank closes it
    messages: list = []
    a = _agent([rank.pid], messages)
    try:
        _sampled(messages, rank.pid, 1)
        _settled([rank.pid])
        said = _stacks(a, messages, 7)
        # Its connections too, counted with its stack: the two still established, and every socket's
        # own end (the one its peer closed as well).
        assert said.sockets[rank.pid] == protocol.SocketQueues(
            established=2, unsent=0, unread=3345, peer_closed=1,
            links=tuple(sorted((end, f"127.0.0.1:{port}") for end in ends[:2])), endpoints=tuple(sorted(ends)))
    finally:
        a.stop.set()
        _end(rank)
        for p in peers:
            p.close()
        server.close()


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_what_a_rank_sent_is_in_its_unsent_bytes_or_its_peers_unread_bytes(host):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        probe = socket.socket(family)
        probe.bind((host, 0))
        probe.close()
    except OSError:
        pytest.skip(f"no {host} here")
    receiver = subprocess.Popen([sys.executable, "-c", f"""
import socket, time
server = socket.socket({int(family)})
server.bind(({host!r}, 0))
server.listen(1)
print(server.getsockname()[1], flush=True)
peer, _ = server.accept()                      # never read
time.sleep(60)
"""], stdout=subprocess.PIPE, text=True)
    port = int(receiver.stdout.readline())
    sender = subprocess.Popen([sys.executable, "-c", f"""
import socket, time
c = socket.create_connection(({host!r}, {port}))
c.setblocking(False)
sent = 0
while True:                                    # until the peer's window and its own buffer are full
    try:
        sent += c.send(b'x' * 65536)
    except BlockingIOError:
        break
print(sent, flush=True)
time.sleep(60)
"""], stdout=subprocess.PIPE, text=True)
    sent = int(sender.stdout.readline())
    messages: list = []
    a = _agent([sender.pid, receiver.pid], messages)
    try:
        _sampled(messages, sender.pid, 1)
        _sampled(messages, receiver.pid, 1)
        _settled([sender.pid, receiver.pid])       # every ACK in: no byte both unacknowledged and arrived
        said = _stacks(a, messages, 8)
        out, into = said.sockets[sender.pid], said.sockets[receiver.pid]
        assert (out.established, into.established, out.unread, into.unsent) == (1, 1, 0, 0)
        assert out.unsent > 0 and into.unread > 0
        assert out.unsent + into.unread == sent, (sent, out, into)
    finally:
        a.stop.set()
        _end(sender, receiver)


def test_the_sample_after_the_agents_py_spy_read_a_rank_says_it_held_it():
    # py-spy suspends the rank while it reads: that sample's CPU was not the rank's to use
    # (hangwatch/progress.py: a held sample starts no quiet time).
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    messages: list = []
    a = _agent([rank.pid], messages)
    try:
        # The agent's own first stacks (it takes them when it finds ranks) held it too: after them,
        # two samples that say nothing held it.
        _wait(lambda: any(m.get("type") == "stacks" for m in messages), "the agent took no stacks of its own")
        taken = len(_samples(messages, rank.pid))
        _wait(lambda: [s.held for s in _samples(messages, rank.pid)[taken + 1:]][:2] == [None, None],
              "no samples after the agent's own stacks")
        assert a.py_spy is not None
        read = len(_samples(messages, rank.pid))
        a.stacks(1, False, None)                      # a real dump, as the watcher's ask makes it
        done = len(_samples(messages, rank.pid))
        after = _wait(lambda: len(_samples(messages, rank.pid)) >= done + 3 and _samples(messages, rank.pid)[read:],
                      "no samples after the dump")
        held = [s.held for s in after]
        # The samples whose time the dump fell in say so (one may come before stacks() returns);
        # the ones before and after, nothing.
        first = held.index(True)
        last = len(held) - 1 - held[::-1].index(True)
        assert held == [None] * first + [True] * (last - first + 1) + [None] * (len(held) - last - 1), held
        assert len(held) - last - 1 >= 2, held
    finally:
        a.stop.set()
        _end(rank)


def test_a_rank_the_kernel_stopped_is_read_once_and_a_running_one_at_its_own_line_deeper():
    # In a stall the Python frames go first and native frames follow for a rank whose Python stack
    # does not stop in torch.distributed. A rank stopped by SIGSTOP is decided by the kernel's state
    # and its Python frames: its native read (7 s on CI's box) would only hold the answer.
    # Each says when it is in its loop: stopped while its interpreter still starts (a loaded box),
    # a process has no Python stack yet for any reader ("Failed to get stack traces").
    code = "print('looping', flush=True)\nwhile True:\n    pass\n"
    stopped = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    running = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert stopped.stdout.readline() == running.stdout.readline() == "looping\n"
    messages: list = []
    a = _agent([stopped.pid, running.pid], messages)
    try:
        _sampled(messages, stopped.pid, 1)
        _sampled(messages, running.pid, 1)
        os.kill(stopped.pid, signal.SIGSTOP)
        _stopped(stopped.pid)
        a.stacks(request_id=11, native="stall")
        said = [protocol.agent_message(m) for m in messages if m.get("type") == "stacks" and m.get("id") == 11]
        assert [s.partial for s in said] == [(running.pid,), ()], said
        assert sorted(said[0].stacks) == sorted(said[1].stacks) == sorted([stopped.pid, running.pid])
        assert all(isinstance(s.stacks[stopped.pid], list) for s in said), said
    finally:
        a.stop.set()
        _end(stopped, running)


def test_two_reads_of_one_rank_at_once_never_collide_into_a_permission_error():
    # The agent's own stacks (every stack_every) and a watcher's ask can read one rank at once. A
    # process has one ptrace tracer: the second py-spy's attach failed with EPERM, and the agent
    # said "ptrace not permitted" with the ptrace_scope fix (CI: "stacks unavailable for rank 0
    # ... see the notice for the fix", as root). The agent reads a rank once at a time.
    rank = subprocess.Popen([sys.executable, "-c", "while True:\n    pass\n"])
    messages: list = []
    a = _agent([rank.pid], messages)
    try:
        _sampled(messages, rank.pid, 1)
        assert a.py_spy is not None
        said: list = []

        def read():
            for _ in range(15):
                said.append(a.dump(rank.pid, False))
        readers = [threading.Thread(target=read) for _ in range(3)]
        for r in readers:
            r.start()
        for r in readers:
            r.join()
        assert [d for d in said if not isinstance(d, list)] == [], said
    finally:
        a.stop.set()
        _end(rank)
