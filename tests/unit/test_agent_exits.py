"""What the agent says when a rank ends, and the clock it answers with: real processes and real
TCP connections on this machine, read by the real agent (node/agent.py) in this process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from ddp_preflight.node import agent as agent_module
from ddp_preflight.node import proc
from ddp_preflight.node.exitcodes import ExitCodes

ROOT = Path(__file__).resolve().parents[2]

HOLDER = """
import socket, sys, time, os
conns = [socket.create_connection(("127.0.0.1", int(sys.argv[1]))) for _ in range(3)]
trigger = sys.argv[2]
while not os.path.exists(trigger):
    time.sleep(0.05)
for c in conns:            # it closes its own connections: on its way out
    c.close()
time.sleep(60)
"""


def _agent(pids, messages):
    spec = {"program": "agent", "node": "here", "pids": pids, "interval": 0.2, "stack_every": 3600.0}
    a = agent_module.Agent(spec)
    a.emit = messages.append
    threading.Thread(target=a.run, daemon=True).start()
    return a


def _wait(predicate, what, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(what)


def test_a_rank_that_closed_its_own_connections_when_another_ended_is_said_to(tmp_path: Path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: [accepted.append(server.accept()[0]) for _ in range(6)], daemon=True).start()
    leaving_trigger, staying_trigger = tmp_path / "leave", tmp_path / "never"
    leaving = subprocess.Popen([sys.executable, "-c", HOLDER, str(port), str(leaving_trigger)])
    staying = subprocess.Popen([sys.executable, "-c", HOLDER, str(port), str(staying_trigger)])
    first = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    messages: list = []
    a = _agent([leaving.pid, staying.pid, first.pid], messages)
    try:
        _wait(lambda: len(accepted) == 6, "the holders never connected")
        # Counted once with every connection open (a count comes every CONNECTIONS_EVERY samples).
        _wait(lambda: a.held.get(leaving.pid) == 3 and a.held.get(staying.pid) == 3, f"not counted: {a.held}")
        leaving_trigger.touch()
        # The staying rank's peer closes on it: its socket stays open (CLOSE_WAIT), it closed nothing.
        for conn in accepted:
            if conn.getpeername()[1] in _local_ports(staying.pid):
                conn.close()
        time.sleep(0.5)
        first.kill()          # reaped only after the agent saw it: its code is read while it is a zombie
        said = _wait(lambda: next((m for m in messages if m.get("type") == "exit" and m["pid"] == first.pid), None),
                     "no exit message")
        # (Other ranks this machine runs may be listed too: only this test's are read.)
        assert {p: said["closed"].get(p) for p in (leaving.pid, staying.pid)} == {leaving.pid: 3, staying.pid: 0}, said
        assert first.pid not in said["closed"]
        assert said["code"] == 9 and isinstance(said["t"], float)
    finally:
        a.stop.set()
        for p in (leaving, staying, first):
            p.kill()
            p.wait()
        server.close()
        for conn in accepted:
            conn.close()


def _local_ports(pid: int) -> set[int]:
    """The local ports of a process's TCP sockets (ss, from iproute2)."""
    out = subprocess.run(["ss", "-tnpH"], capture_output=True, text=True).stdout
    ports = set()
    for line in out.splitlines():
        if f"pid={pid}," in line:
            ports.add(int(line.split()[3].rsplit(":", 1)[1]))
    return ports


def test_the_agent_answers_the_watchers_clock_with_its_own_at_once():
    messages: list = []
    a = agent_module.Agent({"program": "agent", "node": "here", "pids": [], "interval": 1.0})
    a.emit = messages.append
    before = time.time()
    a.command({"cmd": "clock", "t": 123.5})
    assert messages == [{"type": "clock", "asked": 123.5, "t": messages[0]["t"]}]
    assert before <= messages[0]["t"] <= time.time()


def _exit_of(messages, pid):
    return _wait(lambda: next((m for m in messages if m.get("type") == "exit" and m["pid"] == pid), None),
                 f"no exit message for {pid}")


def test_a_ranks_output_file_is_read_at_its_end_and_a_pipe_never_is(tmp_path: Path):
    log = tmp_path / "rank.log"
    script = "import sys, time; time.sleep(1.5); print('one'); print('two', flush=True); " \
             "sys.stderr.write('three\\n'); sys.exit(2)"
    with log.open("w") as out:
        to_file = subprocess.Popen([sys.executable, "-c", script], stdout=out, stderr=subprocess.STDOUT)
    to_pipe = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    messages: list = []
    a = _agent([to_file.pid, to_pipe.pid], messages)
    try:
        said = _exit_of(messages, to_file.pid)
        assert said["output"] == ["one", "two", "three"] and said["code"] == 2 << 8, said
        piped = _exit_of(messages, to_pipe.pid)
        assert "output" not in piped, piped
        # The agent never opened the pipe: every line still reached its reader.
        assert to_pipe.stdout.read().splitlines() == ["one", "two", "three"]
        _wait(lambda: not {to_file.pid, to_pipe.pid} & set(a.keeper.kept), "an output file was kept after its rank ended")
    finally:
        a.stop.set()
        for p in (to_file, to_pipe):
            p.kill()
            p.wait()


def test_a_ranks_own_record_of_its_end_is_read_once_at_its_end(tmp_path: Path):
    from ddp_preflight.node import rank_bootstrap
    folder = tmp_path / "fr"
    folder.mkdir(mode=0o700)
    script = tmp_path / "train.py"
    script.write_text("import time\ntime.sleep(1.5)\nraise ValueError('bad shard 7')\n")
    rank = subprocess.Popen([sys.executable, rank_bootstrap.__file__, str(script)], stderr=subprocess.DEVNULL,
                            env={**__import__("os").environ, rank_bootstrap.FOLDER_VARIABLE: str(folder)})
    messages: list = []
    a = _agent([rank.pid], messages)
    try:
        said = _exit_of(messages, rank.pid)
        ending = said["ending"]
        assert (ending["how"], ending["type"], ending["message"], ending["frames"][-1]["line"]) == \
            ("raised", "ValueError", "bad shard 7", 3), ending
        assert not (folder / f"{rank.pid}.end").exists()           # read once: a pid is reused
    finally:
        a.stop.set()
        rank.kill()
        rank.wait()


def test_socket_queues_say_what_is_unread_and_what_is_unacknowledged():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    # A rank that sends 4 MB to a peer that never reads: its bytes wait unacknowledged (the peer's
    # window is full); a rank that is sent to and never reads holds them unread.
    sender = subprocess.Popen([sys.executable, "-c", f"""
import socket, time
c = socket.create_connection(('127.0.0.1', {port}))
c.setblocking(False)
sent = 0
while sent < 4 << 20:
    try:
        sent += c.send(b'x' * 65536)
    except BlockingIOError:
        time.sleep(0.05)
        if sent: break
time.sleep(60)
"""])
    peer, _ = server.accept()
    messages: list = []
    a = _agent([sender.pid], messages)
    try:
        time.sleep(1.5)
        a.stacks(request_id=1)
        said = next(m for m in messages if m.get("type") == "stacks")
        queues = said["sockets"][str(sender.pid)]
        assert queues["established"] == 1 and queues["unsent"] > 0 and queues["unread"] == 0, queues
    finally:
        a.stop.set()
        sender.kill()
        sender.wait()
        peer.close()
        server.close()



REAPER = """
import subprocess, sys
rank = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
rank.wait()                       # reaped the moment it ends, as torchrun's poll does
print(rank.pid, flush=True)
"""


def test_the_kernels_exit_record_gives_a_code_after_the_parent_reaped_the_rank():
    """The zombie is gone before anyone looks (its parent waited on it): the code is still known."""
    codes = ExitCodes()
    assert codes.start() is None
    try:
        done = subprocess.run([sys.executable, "-c", REAPER], capture_output=True, text=True, check=True)
        pid = int(done.stdout)
        assert proc.stat(pid) is None
        assert codes.status(pid) == 3 << 8
    finally:
        codes.close()


def test_the_kernels_exit_record_reaches_an_agent_in_another_network_namespace(tmp_path: Path):
    """As on the lab's nodes: the kernel sends exit records in the first namespace only."""
    name = f"ec{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        script = ("import subprocess, sys\nfrom ddp_preflight.node.exitcodes import ExitCodes\nc = ExitCodes()\n"
                  "print(c.start())\nprint(c.status(int(subprocess.run([sys.executable, '-c', sys.argv[1]], "
                  "capture_output=True, text=True).stdout)))")
        done = subprocess.run(["ip", "netns", "exec", name, sys.executable, "-c", script, REAPER],
                              capture_output=True, text=True, cwd=ROOT, check=True)
        assert done.stdout.split() == ["None", str(3 << 8)], done
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True)


def test_a_count_holds_only_for_the_sockets_listed_before_its_table_was_read(tmp_path: Path):
    # CI, loaded: a holder's three connections came between the agent's table read and its
    # listing of the holder's sockets; counted as none, that count was kept for ever (its sockets
    # unchanged since the listing). And the table, read in pieces while connections came, listed
    # the other holder's socket twice: it "held" 4 of its 3.
    from ddp_preflight.node import sockets
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(port), str(tmp_path / "never")])
    try:
        accepted = [server.accept()[0] for _ in range(3)]
        _wait(lambda: len(sockets.rank_sockets([holder.pid])[holder.pid]) == 3, "the holder never connected")
        netns = proc.netns(holder.pid)
        fresh = proc.tcp_table(holder.pid)
        mine = [s for s in fresh if s.inode in (proc.socket_inodes(holder.pid) or set())]
        # A table another reader took before the listing (here: before its connections, empty):
        # the count is not kept against the listing, so the next sample reads again.
        against: dict = {}
        assert sockets.rank_sockets([holder.pid], {netns: []}, against) == {holder.pid: []} and against == {}
        # Read after the listing, the count holds for what was listed.
        against = {}
        assert len(sockets.rank_sockets([holder.pid], None, against)[holder.pid]) == 3
        assert against == {holder.pid: proc.socket_inodes(holder.pid)}
        # A table that lists a socket twice counts it once.
        doubled = {netns: fresh + mine[:1]}
        assert len(sockets.rank_sockets([holder.pid], doubled)[holder.pid]) == 3
        # The agent: a count from a stale table is read again at the next count.
        a = agent_module.Agent({"program": "agent", "node": "here", "pids": [holder.pid], "interval": 0.2,
                                "stack_every": 3600.0})
        assert a.count_sockets([holder.pid], {netns: []}, time.time()) == {holder.pid: []}
        assert len(a.count_sockets([holder.pid], {}, time.time())[holder.pid]) == 3
        for c in accepted:
            c.close()
    finally:
        holder.kill()
        holder.wait()
        server.close()
