"""Bad input through the real command (`python -m ddp_preflight` in a subprocess): a usage error
is exit 2 and one line on stderr, a finding exit 1, and never a traceback; an input that names
no host never falls back to checking this machine."""

from __future__ import annotations

import json
import os
import random
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ddp_preflight.node.boot import STAGE0

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "ddp_preflight"]


def cli(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    # Slurm's variables come only from the test, whatever the shell running it has.
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          env={**base, **(env or {})})
    assert "Traceback" not in done.stderr, done.stderr
    return done


def usage_error(*args: str, env: dict | None = None) -> str:
    """The one line a usage error prints, after checking it is one."""
    done = cli(*args, env=env)
    assert (done.returncode, done.stdout) == (2, ""), (done.returncode, done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("ddp-preflight: error: "), done.stderr
    return done.stderr.strip()


# --- Slurm ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("nodelist,reason", [
    ("node[3-1]", "the range 3-1 runs backwards, so it names no host"),
    (",,,", "it lists no hosts"),
    ("", "it lists no hosts"),
    ("node[1-99999999]", "it lists 99999999 hosts, more than the 4096 ddp-preflight takes"),
    ("node[a-c]", "'a-c' is not a number or a range of numbers like 1-4"),
    ("node[1-3", "a '[' without its ']'"),
])
def test_a_slurm_list_without_usable_hosts_is_a_usage_error(nodelist, reason):
    line = usage_error("--slurm", "--json", env={"SLURM_JOB_NODELIST": nodelist})

    assert line.startswith(f"ddp-preflight: error: --slurm: SLURM_JOB_NODELIST={nodelist!r}: ")
    assert line.endswith(reason)


# --- hostfiles -------------------------------------------------------------------------------------

def test_a_hostfile_of_random_bytes_is_a_usage_error(tmp_path):
    path = tmp_path / "hostfile"
    path.write_bytes(random.Random(11).randbytes(2048))

    assert f"hostfile {path} is not a text file" in usage_error("--hostfile", str(path))


@pytest.mark.parametrize("text,expected", [
    ("master slots=0\n", "line 1: slots must be a number of 1 or more, not '0'"),
    ("master slots=-2\n", "line 1: slots must be a number of 1 or more, not '-2'"),
    ("master slots=2\nworker1\n", "gives slots for some hosts but not for worker1 (line 2): give every host its "
                                  "slots=N, or pass --nproc-per-node N"),
])
def test_hostfile_slots_that_cannot_be_the_ranks_per_node_are_usage_errors(tmp_path, text, expected):
    path = tmp_path / "hostfile"
    path.write_text(text)

    assert expected in usage_error("--hostfile", str(path))


# --- one entry per machine -------------------------------------------------------------------------

def test_the_master_twice_is_named():
    line = usage_error("master", "master")

    assert line.startswith("ddp-preflight: error: master is listed twice in the command line: "
                           "two entries for one machine would start two node ranks there")


def test_a_host_on_the_command_line_and_in_the_hostfile_is_named(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("worker1 slots=2\nmaster slots=2\n")

    line = usage_error("master", "--hostfile", str(path))
    assert line.startswith(f"ddp-preflight: error: master is listed in the command line and in hostfile {path}: ")


# --- processes per node ----------------------------------------------------------------------------

@pytest.mark.parametrize("count", ["0", "-1"])
def test_fewer_than_one_process_per_node_is_a_usage_error(count):
    line = usage_error("--nproc-per-node", count)

    assert line == (f"ddp-preflight: error: --nproc-per-node is {count}: every node runs at least one "
                    "process, give 1 or more")


def test_more_processes_than_cores_fails_the_check_naming_the_node():
    done = cli("--nproc-per-node", "10000", "--only", "ranks-per-node", "--json")

    assert done.returncode == 1, done.stderr
    (result,) = json.loads(done.stdout)["results"]
    assert (result["check"], result["status"], result["node"]) == ("ranks-per-node", "fail", socket.gethostname())
    assert result["summary"].startswith(f"10000 ranks per node, but {socket.gethostname()} has "
                                        f"{len(os.sched_getaffinity(0))} usable core")


# --- --python --------------------------------------------------------------------------------------

def node_error(*args: str) -> dict:
    """This machine's node-reachable result: the node's one-line error, exit 1."""
    done = cli("--only", "node-reachable", "--json", *args)
    assert done.returncode == 1 and done.stderr == "", (done.returncode, done.stderr)
    (result,) = json.loads(done.stdout)["results"]
    assert result["status"] == "error"
    return result


def test_a_program_that_is_not_python():
    result = node_error("--python", "/bin/ls")

    # What ls itself said of the one line of Python it was given (node/boot.py's STAGE0).
    assert result["summary"].endswith("/bin/ls is not a Python: it ran and exited with code 2: /bin/ls: cannot "
                                      f"access '{STAGE0}': No such file or directory")


def test_a_folder_is_a_folder_and_gets_no_chmod(tmp_path):
    result = node_error("--python", str(tmp_path))

    assert result["summary"].endswith(f"{tmp_path} is a folder, not a Python")
    assert "chmod" not in result["fix"]


def test_a_text_file_is_not_a_program_even_when_executable(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("touch ran-as-a-shell-script\n")
    text.chmod(0o755)

    result = node_error("--python", str(text))
    assert result["summary"].endswith(f"{text} is a plain file (neither a binary nor a #! script), not a Python")
    assert not (ROOT / "ran-as-a-shell-script").exists()       # the shell never ran it as a script


def test_a_missing_path_does_not_exist(tmp_path):
    result = node_error("--python", str(tmp_path / "venv" / "bin" / "python"))

    assert result["summary"].endswith(f"the training Python {tmp_path}/venv/bin/python does not exist there")


# --- ssh -------------------------------------------------------------------------------------------

@pytest.fixture
def resetting_peer():
    """A real TCP server that accepts, reads the client's ssh banner, then resets the connection
    (SO_LINGER 0) before sending its own: paramiko fails while reading the peer's banner."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                try:
                    conn.recv(256)
                except OSError:
                    pass
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


def test_a_peer_that_resets_during_the_banner_is_one_line_and_no_traceback(resetting_peer, tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text(f"Host resetter\n  HostName 127.0.0.1\n  Port {resetting_peer}\n  User nobody\n")

    done = cli("resetter", "--ssh-config", str(config), "--only", "node-reachable", "--json")

    assert done.returncode == 1
    assert done.stderr == ""            # paramiko's log (its traceback) reaches no terminal
    (result,) = json.loads(done.stdout)["results"]
    assert result["summary"] == "resetter: its ssh port accepted the connection, then reset it before the ssh greeting"


def test_python_for_one_node_is_that_nodes_and_a_word_that_names_no_host_is_refused():
    # Issue 38: a per-node Python needed --config; --python NODE:PATH names it as --data-dir does.
    here = socket.gethostname()
    result = node_error("--python", f"{here}:/bin/ls")
    assert "/bin/ls is not a Python" in result["summary"]
    assert usage_error("--python", "elsewhere:/opt/py/bin/python") == (
        f"ddp-preflight: error: --python elsewhere:/opt/py/bin/python: elsewhere is not one of the hosts ({here}): "
        "write --python NODE:PATH with a host of this run, or --python PATH for every node")
    assert usage_error("--python", f"{here}:") == (
        f"ddp-preflight: error: --python {here}:: no Python after '{here}:': write --python {here}:PATH")


def test_a_stale_ssh_config_in_the_environment_does_not_stop_a_purely_local_run(tmp_path):
    # Issue 38: with no host, nothing goes over ssh: the variable's file, gone, stopped the run.
    stale = {"DDP_PREFLIGHT_SSH_CONFIG": str(tmp_path / "gone")}
    done = cli("--only", "python-parity", "--json", env=stale)
    assert done.returncode == 0, (done.stdout[-500:], done.stderr)
    assert [r["check"] for r in json.loads(done.stdout)["results"]] == ["python-parity"]
    # Named on the command line, or with hosts to reach, it is still the one-line error.
    # The variable's file is said to come from the variable: a newcomer did not type that path.
    assert usage_error("--only", "python-parity", "--ssh-config", str(tmp_path / "gone")) == \
        f"ddp-preflight: error: ssh config {tmp_path / 'gone'} does not exist: give an OpenSSH client config file " \
        "(as ssh -F takes)"
    assert usage_error("master", "--only", "python-parity", env=stale) == \
        f"ddp-preflight: error: ssh config {tmp_path / 'gone'} (from $DDP_PREFLIGHT_SSH_CONFIG) does not exist: " \
        "give an OpenSSH client config file (as ssh -F takes)"
