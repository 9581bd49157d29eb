"""Keys, sshd per node, and the OpenSSH client config that makes `ssh -F FILE worker1` work."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from .errors import LabError
from .nodeexec import in_node
from .state import LabState, Node
from .system import process_start_ticks, run

SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")   # Debian's sshd refuses to start without it


def keygen(path: Path, comment: str) -> None:
    if not path.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


def client_key(state: LabState) -> Path:
    state.ssh_dir.mkdir(parents=True, exist_ok=True)
    key = state.ssh_dir / "id_ed25519"
    keygen(key, f"ddp-preflight-lab-{state.name}")
    shutil.copyfile(key.with_suffix(".pub"), state.ssh_dir / "authorized_keys")
    return key


def write_sshd_config(state: LabState, node: Node) -> Path:
    folder = state.node_dir(node.name)
    host_key = folder / "ssh_host_ed25519_key"
    keygen(host_key, f"root@{node.name}")
    config = folder / "sshd_config"
    config.write_text(f"""\
# sshd of lab node {node.name} (ddp-preflight lab {state.name})
Port 22
ListenAddress 0.0.0.0
ListenAddress ::
HostKey {host_key}
PidFile none
AuthorizedKeysFile {state.ssh_dir / 'authorized_keys'}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
PrintMotd no
# A fan-out opens many sessions at once; the defaults would drop some.
MaxStartups 128
MaxSessions 64
AcceptEnv LANG LC_*
Subsystem sftp internal-sftp
""")
    return config


def start(state: LabState, node: Node) -> None:
    folder = state.node_dir(node.name)
    log = open(folder / "sshd.log", "ab")
    argv = in_node(state, node, [SSHD, "-D", "-e", "-f", str(folder / "sshd_config")])
    # Each exec in the chain (ip, unshare, sh) replaces the last: the PID is sshd's.
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                            start_new_session=True)
    log.close()
    node.sshd_pid = proc.pid
    node.sshd_start = process_start_ticks(proc.pid) or 0
    # The lab outlives this process; no one waits for it here.
    proc.returncode = 0


def wait_ready(state: LabState, node: Node, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((node.ipv4, 22), timeout=0.5) as conn:
                if conn.recv(4).startswith(b"SSH-"):
                    return
        except OSError:
            pass
        if not os.path.exists(f"/proc/{node.sshd_pid}"):
            log = (state.node_dir(node.name) / "sshd.log").read_text(errors="replace").strip()
            reason = log.splitlines()[-1] if log else "no output"
            raise LabError(f"sshd on lab node {node.name} exited: {reason}")
        time.sleep(0.05)
    raise LabError(f"sshd on lab node {node.name} ({node.ipv4}:22) did not answer within "
                   f"{timeout:.0f} s; see {state.node_dir(node.name) / 'sshd.log'}")


def write_client_files(state: LabState) -> None:
    known = []
    entries = []
    key = state.ssh_dir / "id_ed25519"
    for node in state.nodes:
        host_pub = (state.node_dir(node.name) / "ssh_host_ed25519_key.pub").read_text().split()
        known.append(f"{node.name},{node.ipv4},{node.ipv6} {host_pub[0]} {host_pub[1]}")
        entries.append(f"""\
Host {node.name}
  HostName {node.ipv4}
  User root
  Port 22
  IdentityFile {key}
  IdentitiesOnly yes
  UserKnownHostsFile {state.ssh_dir / 'known_hosts'}
  StrictHostKeyChecking yes
  ConnectTimeout 5
  LogLevel ERROR
""")
    (state.ssh_dir / "known_hosts").write_text("\n".join(known) + "\n")
    state.ssh_config.write_text(f"# ddp-preflight lab {state.name}: one Host per node\n\n"
                                + "\n".join(entries))
