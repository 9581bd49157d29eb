"""Issue 23, attack 8 over SSH: the facts program dies with its master. A collector busy on a
node (hashing a data folder of 8 TiB) is gone, with everything it started and its private folder,
once the master is killed (its channel closes: EOF) or once the master's line falls silent (the
node's link is down: no EOF can arrive; the lease, transport/node.py's FACTS_LEASE)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ddp_preflight.node.facts import shards
from ddp_preflight.transport.node import FACTS_LEASE

from .test_launch_lab import CLI, REPO


@pytest.fixture
def huge_data():
    """A data folder (the lab's nodes share this machine's files) of 1,024 sparse shards of 1 GiB
    each: no disk, and hashing them takes far longer than any test. Each is exactly at the size
    over which a shard is only sampled (node/facts/shards.py), so every byte of each is read."""
    folder = Path(tempfile.mkdtemp(prefix="ddpp-huge-data-"))
    folder.chmod(0o755)
    for n in range(1024):
        shard = folder / f"shard_{n:04d}.bin"
        shard.touch()
        os.truncate(shard, shards.SAMPLE_OVER)
    yield folder, folder
    shutil.rmtree(folder, ignore_errors=True)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def reading(folder: Path) -> list[int]:
    """The processes that have a file of the folder open."""
    out = []
    for fds in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd).startswith(f"{folder}/") for fd in fds.iterdir()):
                out.append(int(fds.parent.name))
        except OSError:
            continue
    return out


def start_hashing_master(lab, data: Path, shard: Path) -> tuple[subprocess.Popen, int, str]:
    """`ddp-preflight worker1 --data-dir` while worker1's facts program hashes the shard: (the
    master, the facts program there, its private folder)."""
    master = subprocess.Popen([*CLI, "worker1", "--ssh-config", str(lab.ssh_config), "--no-probes", "--only",
                               "data-shards", "--data-dir", str(data)], cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not reading(shard):
        assert master.poll() is None and time.monotonic() < deadline, "the facts program never read the shard"
        time.sleep(0.2)
    [facts] = reading(shard)
    private = private_folder_of(facts)
    assert os.path.isdir(private)
    return master, facts, private


def private_folder_of(pid: int) -> str:
    """Where boot.py unpacked the package the program runs: its frames' files are in that zip."""
    done = subprocess.run([str(Path(sys.executable).parent / "py-spy"), "dump", "--json", "--pid", str(pid)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for thread in json.loads(done.stdout):
        for frame in thread["frames"]:
            found = re.match(r"(/.*/ddp-preflight-node-[^/]+)/node\.zip/", frame["filename"])
            if found:
                return found.group(1)
    raise AssertionError(f"no frame of the node package in {pid}: {done.stdout[:2000]}")


def gone_within(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [p for p in pids if alive(p)]


def end(pids: list[int]) -> None:
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_killed_master_leaves_no_facts_program_on_the_node(clean_lab, huge_data):
    master, facts, private = start_hashing_master(clean_lab, *huge_data)
    try:
        master.kill()
        master.wait()
        left = gone_within([facts], FACTS_LEASE)
    finally:
        end([facts])
    assert left == []
    assert not os.path.exists(private)


def test_a_node_cut_off_from_its_master_ends_its_facts_program_within_the_lease(clean_lab, huge_data):
    master, facts, private = start_hashing_master(clean_lab, *huge_data)
    netns = clean_lab.node("worker1").netns
    try:
        subprocess.run(["ip", "-n", netns, "link", "set", "eth0", "down"], check=True)
        master.kill()           # its channel's close cannot reach worker1 now: only the lease can
        master.wait()
        left = gone_within([facts], FACTS_LEASE + 15)
    finally:
        subprocess.run(["ip", "-n", netns, "link", "set", "eth0", "up"], check=True)
        end([facts])
    assert left == []
    assert not os.path.exists(private)
