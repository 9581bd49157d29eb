"""Issue 34, part A, item 3 against the lab's real sshd: with HOME kept from another user (sudo),
that user's ~/.ssh/known_hosts must not vouch for a node's host key. The intruder's file holds
the lab node's key; root's own home (the password database's) has none: the node's key is not
known here, so the connection is refused, as OpenSSH refuses it. Root's own ~/.ssh, where this
box has one (it may know the lab's keys), is hidden from the run by a private mount namespace
(unshare -m, a tmpfs over it), so the case always runs and nothing of root's is changed."""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import uuid

import pytest

from tests.hostile import hostile_user

pytestmark = pytest.mark.timeout(180)
CLI = [sys.executable, "-m", "ddp_preflight"]


def without_roots_ssh_files(argv: list[str]) -> list[str]:
    """argv in a mount namespace of its own where root's ~/.ssh (the password database's home)
    is an empty tmpfs; where there is none, there is nothing of root's to hide."""
    ssh = os.path.join(pwd.getpwuid(os.geteuid()).pw_dir, ".ssh")
    hide = f"mount -t tmpfs -o mode=700 ddpp-no-ssh {shlex.quote(ssh)} && " if os.path.isdir(ssh) else ""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", hide + 'exec "$@"', "sh", *argv]


def test_another_users_known_hosts_in_home_vouches_for_no_node(clean_lab, tmp_path):
    user = hostile_user()
    lab_config = clean_lab.ssh_config.read_text()
    known = next(line.split(None, 1)[1].strip() for line in lab_config.splitlines()
                 if line.strip().startswith("UserKnownHostsFile"))
    # The lab's config without its own known hosts file: the default ~/.ssh/known_hosts applies.
    config = tmp_path / "ssh_config"
    config.write_text("\n".join(line for line in lab_config.splitlines()
                                if not line.strip().startswith("UserKnownHostsFile")) + "\n")
    home = user.home / f"kh-{uuid.uuid4().hex[:8]}"
    user.run(["mkdir", "-p", "-m", "700", str(home / ".ssh")])
    try:
        user.run(["sh", "-c", 'cat > "$1"', "sh", str(home / ".ssh" / "known_hosts")],
                 input=open(known).read())
        done = subprocess.run(without_roots_ssh_files([*CLI, "master", "--ssh-config", str(config), "--only",
                                                       "node-reachable", "--json"]),
                              capture_output=True, text=True, timeout=120, cwd=tmp_path,
                              env={**os.environ, "HOME": str(home)})
    finally:
        shutil.rmtree(home, ignore_errors=True)

    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    [result] = [r for r in json.loads(done.stdout)["results"] if r["check"] == "node-reachable"]
    assert result["status"] == "error", result
    assert result["summary"] == "master: its host key is not known here, so it cannot be verified", result
