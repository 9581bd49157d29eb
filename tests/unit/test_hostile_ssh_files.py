"""Issue 34, part A, item 3: known_hosts and every other per-user ssh file come from the password
database's home of the user the tool runs as, never $HOME (sudo may keep another user's), and a
known hosts file another user owns or could change is refused as an ssh config is. A real second
user (tests/hostile.py) writes the files; root makes the real SSH node (fabric, paramiko)."""

from __future__ import annotations

import os
import pwd
import shutil
import uuid
from pathlib import Path

import pytest

from ddp_preflight.transport.errors import NodeError
from ddp_preflight.transport.ssh import SshNode, known_hosts_files, ssh_config_files
from tests.hostile import hostile_user

ROOT_HOME = pwd.getpwuid(0).pw_dir
FAKE_KEY = "localhost ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHhvc3RpbGVob3N0aGF0dm91Y2hlc2ZvcmFub3RoZXJr\n"


@pytest.fixture
def user():
    return hostile_user()


@pytest.fixture
def intruder_ssh(user):
    """The intruder's own ~/.ssh-like folder with a known_hosts and a config in it."""
    folder = user.home / f"ssh-{uuid.uuid4().hex[:8]}"
    user.run(["mkdir", "-m", "755", str(folder)])
    user.run(["sh", "-c", 'cat > "$1"', "sh", str(folder / "known_hosts")], input=FAKE_KEY)
    user.run(["sh", "-c", 'cat > "$1"', "sh", str(folder / "config")], input="Host *\n  User root\n")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_the_known_hosts_files_come_from_the_password_databases_home_not_home(monkeypatch, user):
    monkeypatch.setenv("HOME", str(user.home))
    assert known_hosts_files({}) == [f"{ROOT_HOME}/.ssh/known_hosts", f"{ROOT_HOME}/.ssh/known_hosts2"]
    assert known_hosts_files({"userknownhostsfile": "~/.ssh/kh %d/kh2 /etc/ssh/kh3"}) == [
        f"{ROOT_HOME}/.ssh/kh", f"{ROOT_HOME}/kh2", "/etc/ssh/kh3"]


def test_the_default_ssh_config_is_the_password_databases_homes_not_homes(monkeypatch, user, intruder_ssh):
    home = intruder_ssh.parent / f"home-{uuid.uuid4().hex[:8]}"
    user.run(["mkdir", "-p", "-m", "755", str(home / ".ssh")])
    try:
        user.run(["cp", str(intruder_ssh / "config"), str(home / ".ssh" / "config")])
        monkeypatch.setenv("HOME", str(home))
        assert all(not p.startswith(str(home)) for p in ssh_config_files(None))
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_a_known_hosts_file_of_another_user_is_refused_before_any_connection(user, intruder_ssh, tmp_path):
    config = tmp_path / "ssh_config"
    known = intruder_ssh / "known_hosts"
    config.write_text(f"Host *\n  UserKnownHostsFile {known}\n")
    with pytest.raises(NodeError) as refused:
        SshNode("localhost", "python3", ssh_config=str(config)).connect()
    assert str(refused.value).splitlines()[0] == (
        f"localhost: known hosts file {known} is refused: it belongs to uid {user.uid}, not to root or this user "
        "(uid 0), and it says which host keys to trust; give a known hosts file only root or this user can change "
        "(chown 0 FILE; chmod go-w FILE and its folders)")


def test_roots_known_hosts_in_a_folder_another_user_can_write_is_refused(user, tmp_path):
    shared = Path(tmp_path / "shared")
    shared.mkdir()
    shared.chmod(0o777)
    known = shared / "known_hosts"
    known.write_text(FAKE_KEY)
    config = tmp_path / "ssh_config"
    config.write_text(f"Host *\n  UserKnownHostsFile {known}\n")
    with pytest.raises(NodeError) as refused:
        SshNode("localhost", "python3", ssh_config=str(config)).connect()
    assert f"known hosts file {known} is refused: {shared} is writable by other users (mode 777)" in str(refused.value)


def _refused_line(label: str, path, user, because: str) -> str:
    article = "an" if label[0] in "aeiou" else "a"
    return (f"localhost: {label} {path} is refused: it belongs to uid {user.uid}, not to root or this user (uid 0), "
            f"and {because}; give {article} {label} only root or this user can change (chown 0 FILE; chmod go-w FILE "
            "and its folders)")


def test_an_identity_file_of_another_user_given_by_its_absolute_path_is_refused(user, intruder_ssh, tmp_path):
    key = intruder_ssh / "id_ed25519"
    user.run(["sh", "-c", 'umask 077; echo not-a-key > "$1"', "sh", str(key)])
    config = tmp_path / "ssh_config"
    config.write_text(f"Host *\n  IdentityFile {key}\n  StrictHostKeyChecking no\n")
    with pytest.raises(NodeError) as refused:
        SshNode("localhost", "python3", ssh_config=str(config)).connect()
    assert str(refused.value).splitlines()[0] == _refused_line("identity file", key, user,
                                                                "ssh signs in with it as this user")


def test_a_certificate_of_another_user_beside_roots_own_key_is_refused(user, tmp_path):
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o755)
    key = keys / "id_ed25519"
    key.write_text("not-a-key\n")
    key.chmod(0o600)
    cert = user.file(keys / "id_ed25519-cert.pub", "ssh-ed25519-cert-v01@openssh.com AAAA\n")
    config = tmp_path / "ssh_config"
    config.write_text(f"Host *\n  IdentityFile {key}\n  StrictHostKeyChecking no\n")
    with pytest.raises(NodeError) as refused:
        SshNode("localhost", "python3", ssh_config=str(config)).connect()
    assert str(refused.value).splitlines()[0] == _refused_line("identity file", cert, user,
                                                                "ssh signs in with it as this user")


@pytest.mark.parametrize("shape", ["program", "argument"])
def test_a_proxy_command_that_runs_another_users_file_is_refused_and_never_run(user, intruder_ssh, tmp_path, shape):
    markers = tmp_path / "markers"
    markers.mkdir(mode=0o777)
    proxy = intruder_ssh / "proxy"
    user.run(["sh", "-c", 'cat > "$1"; chmod 755 "$1"', "sh", str(proxy)],
             input=f"#!/bin/sh\ntouch {markers}/proxy-uid-$(id -u)\n")
    command = str(proxy) if shape == "program" else f"sh {proxy}"
    config = tmp_path / "ssh_config"
    config.write_text(f"Host *\n  ProxyCommand {command} %h %p\n  StrictHostKeyChecking no\n")
    with pytest.raises(NodeError) as refused:
        SshNode("localhost", "python3", ssh_config=str(config)).connect()
    assert list(markers.iterdir()) == []
    assert str(refused.value).splitlines()[0] == _refused_line(
        "ProxyCommand file", proxy, user, "ProxyCommand runs it as this user at every connection")


def test_roots_own_key_and_proxy_program_are_used_as_given(tmp_path):
    from fabric import Config, Connection

    from ddp_preflight.transport.ssh import checked_ssh_config, files_ssh_uses, ssh_file_problem

    key = tmp_path / "id_ed25519"
    key.write_text("not-a-key\n")
    key.chmod(0o600)
    config = tmp_path / "ssh_config"
    config.write_text(f"Host *\n  IdentityFile {key}\n  ProxyCommand cat %h %p\n")
    conn = Connection("localhost", config=Config(ssh_config=checked_ssh_config(str(config), "localhost"), lazy=True))
    used = files_ssh_uses(conn)
    assert [(label, path) for label, path, _ in used] == [
        ("identity file", str(key)), ("ProxyCommand file", shutil.which("cat", path=os.environ["PATH"]))]
    assert [ssh_file_problem(*u) for u in used] == [None, None]
