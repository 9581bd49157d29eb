"""What the agent says when a rank ends, and the clock it answers with: real processes and real
TCP connections on this machine, read by the real agent (node/agent.py) in this process."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from node import agent as agent_module

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
        assert said["closed"] == {leaving.pid: 3, staying.pid: 0}, said
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
