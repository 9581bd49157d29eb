"""Issue 34, part A, item 3: known_hosts and every other per-user ssh file come from the password
database's home of the user the tool runs as, never $HOME (sudo may keep another user's), and a
known hosts file another user owns or could change is refused as an ssh config is. A real second
user (tests/hostile.py) writes the files; root makes the real SSH node (fabric, paramiko)."""

from __future__ import annotations

import pwd
import shutil
import uuid
from pathlib import Path

import pytest

from tests.hostile import hostile_user
from transport.errors import NodeError
from transport.ssh import SshNode, known_hosts_files, ssh_config_files

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
