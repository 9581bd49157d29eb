"""Why a node could not be checked, in one line, with the fix."""

from __future__ import annotations

import socket


class NodeError(Exception):
    """A node that could not be reached or could not run the collector."""

    def __init__(self, summary: str, fix: str | None = None):
        super().__init__(summary)
        self.summary = summary
        self.fix = fix


def explain_connect(host: str, exc: BaseException) -> NodeError:
    """Turn what paramiko/fabric raised into a sentence about this host."""
    import paramiko

    name = type(exc).__name__
    if isinstance(exc, socket.gaierror):
        return NodeError(f"{host}: the name does not resolve ({exc.strerror})",
                         f"add a 'Host {host}' entry with its HostName to your ssh config, "
                         "or pass --ssh-config FILE")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError) or isinstance(exc, ConnectionRefusedError):
        return NodeError(f"{host}: nothing accepts ssh connections (connection refused)",
                         f"start sshd on {host} (sudo systemctl start ssh) or fix Port in the ssh config")
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return NodeError(f"{host}: no answer on the ssh port within the timeout",
                         f"check that {host} is on and its address in the ssh config is right; "
                         "a firewall may drop port 22")
    if isinstance(exc, paramiko.AuthenticationException):
        return NodeError(f"{host}: the ssh key was refused ({exc})",
                         f"ssh-copy-id {host}   # or set IdentityFile for {host} in the ssh config")
    if isinstance(exc, paramiko.BadHostKeyException):
        return NodeError(f"{host}: its host key changed since it was recorded",
                         f"if {host} was reinstalled: ssh-keygen -R {host}; otherwise investigate")
    if isinstance(exc, paramiko.SSHException) and "not found in known_hosts" in str(exc):
        return NodeError(f"{host}: its host key is not known here, so it cannot be verified",
                         f"ssh {host} true   # once, to check and accept its key; or ssh-keyscan {host} >> ~/.ssh/known_hosts")
    if isinstance(exc, paramiko.SSHException):
        return NodeError(f"{host}: ssh failed: {exc}", f"try 'ssh {host} true' to see the full error")
    if isinstance(exc, OSError):
        return NodeError(f"{host}: cannot connect: {exc.strerror or exc}",
                         f"check the network path to {host}")
    return NodeError(f"{host}: {name}: {exc}", f"try 'ssh {host} true' to see the full error")


def explain_python(host: str, python: str, exit_code: int, stderr: str) -> NodeError:
    last = (stderr.strip().splitlines() or [""])[-1][:300]
    if exit_code == 127 or "No such file" in stderr or "not found" in stderr:
        return NodeError(f"{host}: the training Python {python} does not exist there",
                         f"pass --python PATH, or set python under [nodes.{host}] in the config")
    if exit_code == 126:
        return NodeError(f"{host}: {python} is not executable there",
                         f"chmod +x {python} on {host}, or pass the right --python")
    if "SyntaxError" in stderr:
        return NodeError(f"{host}: {python} is too old to run the collector ({last})",
                         f"use a Python 3.8+ environment on {host} (--python PATH)")
    return NodeError(f"{host}: the collector failed with exit code {exit_code}: {last}",
                     f"run '{python} -c \"import torch\"' on {host} to see what is wrong")
