"""OpenSSH's Include in --ssh-config, read as `ssh -F` reads it: the hosts of included files
resolve (paramiko's parser alone ignores the line), an Include inside a Host block leaves that
block going on after it, every included file passes the checks the given one does, and the real
command reaches a host that only an included file names."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from ddp_preflight.transport.ssh import checked_ssh_config, ssh_config_problem

ROOT = Path(__file__).resolve().parents[2]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_included_glob_names_hosts_as_ssh_reads_them(tmp_path):
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "10-lab.conf").write_text("Host worker1\n  HostName 10.213.0.11\n  Port 2201\n")
    (tmp_path / "conf.d" / "20-more.conf").write_text("Host worker2\n  HostName 10.213.0.12\n")
    main = tmp_path / "config"
    main.write_text(f"Include {tmp_path}/conf.d/*.conf\nHost master\n  HostName 10.213.0.200\n"
                    f"  Include {tmp_path}/block.conf\n  Port 2200\n")
    (tmp_path / "block.conf").write_text("User trainer\n")

    config = checked_ssh_config(str(main), "worker1")

    assert ssh_config_problem(str(main)) is None
    assert (config.lookup("worker1")["hostname"], config.lookup("worker1")["port"]) == ("10.213.0.11", "2201")
    assert config.lookup("worker2")["hostname"] == "10.213.0.12"
    master = config.lookup("master")
    assert (master["hostname"], master["user"], master["port"]) == ("10.213.0.200", "trainer", "2200")


def test_an_included_file_another_user_may_change_is_refused_as_the_given_one_is(tmp_path):
    included = tmp_path / "other.conf"
    included.write_text("Host worker1\n  HostName 10.213.0.11\n")
    os.chmod(included, 0o666)
    main = tmp_path / "config"
    main.write_text(f"Include {included}\n")

    problem = ssh_config_problem(str(main))

    assert problem is not None and problem.startswith(f"ssh config {included} is refused: it is writable by other "
                                                      "users (mode 666)")


def test_an_include_of_itself_is_one_line(tmp_path):
    main = tmp_path / "config"
    main.write_text(f"Include {main}\n")

    assert ssh_config_problem(str(main)) == (f"ssh config: {main}: Include nested deeper than 16 levels (does it "
                                             "include itself?)")


def test_the_command_reaches_a_host_only_an_included_file_names(tmp_path):
    (tmp_path / "nodes.conf").write_text(f"Host deadnode\n  HostName 127.0.0.1\n  Port {closed_port()}\n")
    main = tmp_path / "config"
    main.write_text(f"Include {tmp_path}/nodes.conf\n")

    done = subprocess.run([sys.executable, "-m", "ddp_preflight", "deadnode", "--no-probes", "--ssh-config", str(main)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)

    assert done.returncode == 1, done.stderr
    # Connection refused at 127.0.0.1: the included HostName and Port were used (not "does not resolve").
    assert done.stdout.splitlines()[0] == ("NOT CHECKED: deadnode: nothing accepts ssh connections (connection "
                                           "refused) (fix 1 below)")
