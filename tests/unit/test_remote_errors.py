"""Why a node could not be checked, one line each: connect errors told apart by their errno
(paramiko wraps the real one per address), and a --python that is not a Python."""

from __future__ import annotations

import errno
import os
import socket

import pytest
from paramiko.ssh_exception import NoValidConnectionsError, SSHException

from ddp_preflight.transport.errors import explain_connect, explain_python


def refused() -> ConnectionRefusedError:
    """A real refusal: connecting to a port of this machine that nothing listens on."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
    with socket.socket() as client:
        try:
            client.connect(("127.0.0.1", port))
        except ConnectionRefusedError as exc:
            return exc
    pytest.fail(f"something listens on 127.0.0.1:{port}")


def oserror(number: int) -> OSError:
    """The OSError connect() raises for `number`, as paramiko stores it per address."""
    return OSError(number, os.strerror(number))


def test_refused_names_sshd():
    why = explain_connect("worker1", NoValidConnectionsError({("10.0.0.2", 22): refused()}))

    assert why.summary == "worker1: nothing accepts ssh connections (connection refused)"
    assert why.fix.startswith("start sshd on worker1")


def test_no_route_to_host_is_not_called_a_refusal():
    why = explain_connect("worker1", NoValidConnectionsError({("10.0.0.2", 22): oserror(errno.EHOSTUNREACH)}))

    assert why.summary == "worker1: no route to host: nothing answers at its address on the network"
    assert "sshd" not in why.fix and "is on and connected" in why.fix


def test_network_unreachable_points_at_this_machines_routes():
    # paramiko lets ENETUNREACH through as it is, not wrapped.
    why = explain_connect("worker1", oserror(errno.ENETUNREACH))

    assert why.summary == "worker1: network unreachable: this machine has no route to its address"
    assert "ip route get" in why.fix


def test_a_timeout_says_no_answer():
    why = explain_connect("worker1", socket.timeout("timed out"))

    assert why.summary == "worker1: no answer on the ssh port within the timeout"
    assert "firewall" in why.fix


def test_addresses_that_fail_differently_are_each_named():
    why = explain_connect("worker1", NoValidConnectionsError({("fd00::2", 22, 0, 0): oserror(errno.EHOSTUNREACH),
                                                              ("10.0.0.2", 22): refused()}))

    assert why.summary == ("worker1: cannot connect to any of its addresses "
                           "(fd00::2: No route to host; 10.0.0.2: Connection refused)")
    assert why.fix.startswith("start sshd on worker1")      # a refusal: the machine is up


@pytest.mark.parametrize("raised,how", [
    (ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), "reset"),
    (SSHException("Error reading SSH protocol banner[Errno 104] Connection reset by peer"), "reset"),
    (EOFError(), "closed"),
])
def test_a_peer_that_drops_the_connection_before_the_greeting(raised, how):
    why = explain_connect("worker1", raised)

    assert why.summary == f"worker1: its ssh port accepted the connection, then {how} it before the ssh greeting"
    assert why.fix == "ssh -v worker1 true   # to see what answers on its ssh port"


# --- --python --------------------------------------------------------------------------------------

def test_a_folder_is_not_given_chmod_advice():
    why = explain_python("worker1", "/tmp", 126, "DDP_PREFLIGHT_PYTHON folder\n", ran=False)

    assert why.summary == "worker1: /tmp is a folder, not a Python"
    assert "chmod" not in why.fix and "--python worker1:PATH" in why.fix


def test_a_python_environments_folder_names_its_interpreter():
    why = explain_python("worker1", "/home/me/venv/", 126, "DDP_PREFLIGHT_PYTHON environment-folder\n", ran=False)

    assert why.summary == "worker1: /home/me/venv/ is a folder, not a Python (it holds /home/me/venv/bin/python)"
    assert why.fix.startswith("--python worker1:/home/me/venv/bin/python ")


def test_a_plain_file_is_not_a_program():
    why = explain_python("worker1", "/etc/hostname", 126, "DDP_PREFLIGHT_PYTHON not-a-program\n", ran=False)

    assert why.summary == "worker1: /etc/hostname is a plain file (neither a binary nor a #! script), not a Python"
    assert "chmod" not in why.fix


def test_a_missing_python_does_not_exist():
    why = explain_python("worker1", "/opt/venv/bin/python", 126, "DDP_PREFLIGHT_PYTHON missing\n", ran=False)

    assert why.summary == "worker1: the training Python /opt/venv/bin/python does not exist there"


def test_only_a_program_without_the_execute_bit_gets_chmod():
    why = explain_python("worker1", "/opt/py", 126, "DDP_PREFLIGHT_PYTHON not-executable\n", ran=False)

    assert why.summary == "worker1: /opt/py is not executable there"
    assert why.fix.startswith("chmod +x /opt/py on worker1")


def test_another_program_is_not_a_python_even_when_it_says_no_such_file():
    stderr = "/bin/ls: cannot access '-': No such file or directory\n"
    why = explain_python("worker1", "/bin/ls", 2, stderr, ran=False)

    assert why.summary == ("worker1: /bin/ls is not a Python: it ran and exited with code 2: "
                           "/bin/ls: cannot access '-': No such file or directory")
    assert "does not exist" not in why.summary


def test_a_python_that_ran_and_failed_is_reported_as_the_collector_failing():
    why = explain_python("worker1", "/usr/bin/python3", 1, "OSError: [Errno 28] No space left on device\n", ran=True)

    assert why.summary == "worker1: the collector failed with exit code 1: OSError: [Errno 28] No space left on device"


def test_a_dial_nothing_answered_keeps_the_address_for_this_machines_route_to_be_judged():
    # Issue 38: ssh lost to this machine's own route; node-reachable judges the route to the
    # address kept here (preflight/checks/reachability.py), a refusal or a reset never.
    assert explain_connect("worker1", socket.timeout("timed out"), "10.0.0.2").unanswered == "10.0.0.2"
    assert explain_connect("worker1", oserror(errno.ENETUNREACH), "10.0.0.2").unanswered == "10.0.0.2"
    unreachable = NoValidConnectionsError({("10.0.0.2", 22): oserror(errno.EHOSTUNREACH)})
    assert explain_connect("worker1", unreachable).unanswered == "10.0.0.2"
    assert explain_connect("worker1", NoValidConnectionsError({("10.0.0.2", 22): refused()}), "10.0.0.2"
                           ).unanswered is None
    assert explain_connect("worker1", EOFError(), "10.0.0.2").unanswered is None
