"""Issue 23, attacks 3, 8 and 12 (the pickle), by a real second user (tests/hostile.py) against
root: what root writes is never redirected by a link that user planted or swapped in (the log
folder, the incident folder); what root reads of that user's folders is bounded (a FIFO named
train_helpers.py in the code folder, in a data folder, in a folder given to explain; a 400 MB
dump); and the facts program dies with its master.

Each attack is made by the intruder's own processes (ln, mv, mkfifo as ddpp-intruder) in a folder
of theirs, under a root folder they may enter (`arena`)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from ddp_preflight.explain.render import as_text
from ddp_preflight.hangwatch.incident import write as write_bundle
from ddp_preflight.hangwatch.model import Snapshot
from ddp_preflight.launch.output import NodeLogs
from ddp_preflight.node.bounded import size_text
from ddp_preflight.node.facts import shards
from ddp_preflight.preflight.probes.collectives import scan as scan_collectives
from ddp_preflight.transport.node import FACTS_LEASE
from tests.hostile import hostile_user

from .ports import free_port

REPO = Path(__file__).parents[2]
SNAPSHOT = REPO / "tests" / "unit" / "artifacts" / "snapshots" / "deadlock.json"
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
CLI = [sys.executable, "-m", "ddp_preflight"]


@pytest.fixture
def arena():
    """A folder of root's that the intruder may enter (0755), for their folders and root's targets."""
    folder = Path(tempfile.mkdtemp(prefix="ddpp-hostile-files-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def user():
    return hostile_user()


def listing(folder: Path) -> list[str]:
    """Every name under the folder (links not followed), with what it holds for a file."""
    out = []
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        out.append(f"{rel} = {path.read_text()!r}" if path.is_file() and not path.is_symlink() else rel)
    return out


def target_of_root(arena: Path) -> tuple[Path, list[str]]:
    """A folder of root's that the intruder wants root's files in, and what it holds now."""
    target = arena / "target"
    target.mkdir(mode=0o755)
    (target / "keep.txt").write_text("root's own\n")
    return target, listing(target)


def uid_text(user) -> str:
    return f"{user.name} (uid {user.uid})"


# --- attack 3: the log folder and the incident folder ---------------------------------------------

TRAIN = 'print("trained")\n'

# Says it started, waits for the test to say the intruder has swapped the folder, then prints.
TRAIN_AND_WAIT = """
import pathlib, sys, time
pathlib.Path(sys.argv[1]).write_text("started")
while not pathlib.Path(sys.argv[2]).exists():
    time.sleep(0.1)
print("after the swap")
"""


def launch(arena: Path, script: str, log_dir: Path, *args: str) -> subprocess.Popen:
    # The training's own folder is root's alone: the intruder's folders beside it in the arena would
    # be importable from the script's folder (a namespace package), and refused as such.
    code = arena / "code"
    code.mkdir(mode=0o755, exist_ok=True)
    path = code / "train.py"
    path.write_text(script)
    # --force: other users' processes on this shared machine are no reason not to launch here.
    return subprocess.Popen([*CLI, "--no-probes", "--force", "--master-port", str(free_port()), "--launch", "--log-dir",
                             str(log_dir), "--", str(path), *args], cwd=code, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_a_symlink_planted_on_the_way_to_the_log_dir_is_refused_before_anything_runs(arena, user):
    target, before = target_of_root(arena)
    shared = user.folder(arena / "shared", 0o755)
    user.run(["ln", "-s", str(target), str(shared / "runs")])
    log_dir = shared / "runs" / "run1"

    run = launch(arena, TRAIN, log_dir)
    out, err = run.communicate(timeout=300)

    assert (run.returncode, out) == (2, ""), err[-3000:]
    assert err == (f"ddp-preflight: error: cannot write the logs in {log_dir}: {shared}/runs is a symlink of "
                   f"{uid_text(user)}: not followed: give --log-dir a folder that no other user can change\n")
    assert listing(target) == before


def test_a_log_dir_in_a_folder_of_another_user_is_refused(arena, user):
    shared = user.folder(arena / "shared", 0o755)
    (shared / "theirs.txt").write_text("the intruder's\n")
    before = listing(shared)

    run = launch(arena, TRAIN, shared)
    out, err = run.communicate(timeout=300)

    assert (run.returncode, out) == (2, ""), err[-3000:]
    assert err == (f"ddp-preflight: error: cannot write the logs in {shared}: {shared} belongs to {uid_text(user)}, "
                   "who could replace what is written there: give --log-dir a folder that no other user can change\n")
    assert listing(shared) == before


def test_a_symlink_swapped_in_mid_run_redirects_none_of_the_runs_later_files(arena, user):
    """The run folder is made (root's, 0700) inside the intruder's folder; mid-run the intruder moves
    it away and puts a symlink to root's folder in its place: result.json and the rest of the log
    still go to the run's own folder, wherever it now is."""
    target, before = target_of_root(arena)
    shared = user.folder(arena / "shared", 0o755)
    log_dir = shared / "runs" / "run1"
    started, go = arena / "started", arena / "go"

    run = launch(arena, TRAIN_AND_WAIT, log_dir, str(started), str(go))
    try:
        deadline = time.monotonic() + 300
        while not started.exists():
            assert run.poll() is None, run.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the rank never started"
            time.sleep(0.1)
        user.run(["mv", str(shared / "runs"), str(shared / "moved")])
        user.run(["ln", "-s", str(target), str(shared / "runs")])
        go.write_text("")
        out, err = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()

    assert run.returncode == 0, err[-3000:]
    node = os.uname().nodename          # the local node's name
    assert f"[{node} r0] after the swap" in out.splitlines()
    assert listing(target) == before
    moved = shared / "moved" / "run1"
    names = {p.name for p in moved.iterdir()}
    assert names - {"incidents"} == {"plan.json", f"{node}.log", "result.json"}
    # A rank that waits at 0% CPU may be judged stalled: its bundle goes into the run's own folder too.
    for bundle in (moved / "incidents").iterdir() if "incidents" in names else ():
        assert sorted(p.name for p in bundle.iterdir()) == ["incident.json", "report.txt"]
    assert f"[{node} r0] after the swap" in (moved / f"{node}.log").read_text().splitlines()
    assert json.loads((moved / "result.json").read_text())["ranks"][0]["exit"] == 0


def snapshot() -> Snapshot:
    return Snapshot.from_json(json.loads(SNAPSHOT.read_text()))


def test_an_incident_dir_planted_as_a_symlink_is_refused_in_one_line(arena, user):
    target, before = target_of_root(arena)
    shared = user.folder(arena / "shared", 0o755)
    user.run(["ln", "-s", str(target), str(shared / "incidents")])

    with pytest.raises(OSError) as refused:
        write_bundle(snapshot(), {}, str(shared / "incidents"))

    assert str(refused.value) == f"{shared}/incidents is a symlink of {uid_text(user)}: not followed"
    assert listing(target) == before


def test_an_incident_dir_swapped_for_a_symlink_mid_watch_keeps_the_next_bundles(arena, user):
    target, before = target_of_root(arena)
    shared = user.folder(arena / "shared", 0o755)
    first = Path(write_bundle(snapshot(), {}, str(shared / "incidents")))
    user.run(["mv", str(shared / "incidents"), str(shared / "moved")])
    user.run(["ln", "-s", str(target), str(shared / "incidents")])

    second = write_bundle(snapshot(), {}, str(shared / "incidents"))

    assert listing(target) == before
    bundles = sorted(p.name for p in (shared / "moved").iterdir())
    assert bundles == sorted([first.name, Path(second).name]) and len(bundles) == 2
    for name in bundles:
        assert sorted(p.name for p in (shared / "moved" / name).iterdir()) == ["incident.json", "report.txt"]


def run_with_deadline(action, seconds: float = 60):
    """action() in a thread; fails the test if it is still blocked after `seconds` (a FIFO)."""
    result: dict = {}

    def target():
        try:
            result["value"] = action()
        except BaseException as exc:      # handed to the test
            result["error"] = exc
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds} s"
    if "error" in result:
        raise result["error"]
    return result.get("value")


def test_names_planted_in_a_shared_sticky_log_folder_are_not_written_through(arena, user):
    """A log folder like /tmp (root's, sticky, everyone may add names): the intruder's FIFO named
    plan.json and their own file named vm.log are neither waited on nor written into."""
    logs = arena / "shared-logs"
    logs.mkdir()
    logs.chmod(0o1777)
    user.run(["mkfifo", str(logs / "plan.json")])
    user.run(["sh", "-c", f"echo theirs > {logs / 'vm.log'}"])
    told: list[str] = []
    node_logs = NodeLogs(logs, on_failure=told.append)

    run_with_deadline(lambda: node_logs.write_json("plan.json", {"nodes": []}))
    assert told == [f"{logs}/plan.json is a FIFO: not written"]

    again = NodeLogs(logs, on_failure=told.append)
    run_with_deadline(lambda: again.write("vm", "[vm r0] a rank's line"))
    assert told[1:] == [f"{logs}/vm.log is a file of {uid_text(user)}: not written"]
    assert (logs / "vm.log").read_text() == "theirs\n"


# --- attack 8: FIFOs where root reads ---------------------------------------------------------------

def code_folder_with_a_fifo(arena: Path, user) -> Path:
    code = user.folder(arena / "code", 0o755)
    user.file(code / "train.py", "import train_helpers\nprint('train')\n")
    user.run(["mkfifo", str(code / "train_helpers.py")])
    return code


def roots_code_folder_with_a_fifo(arena: Path) -> Path:
    """The same, root's: preflight refuses an intruder's code folder before it reads a name of it
    (test_hostile_code.py), so what a FIFO in a folder it does read costs is asked of root's."""
    code = arena / "code"
    code.mkdir(mode=0o755)
    (code / "train.py").write_text("import train_helpers\nprint('train')\n")
    os.mkfifo(code / "train_helpers.py")
    return code


def roots_data_folder(arena: Path) -> Path:
    """A data folder of root's with one shard: an intruder's is refused before it is read
    (test_hostile_code.py), so a FIFO or a sparse file in one that is read is asked of root's."""
    data = arena / "data"
    data.mkdir(mode=0o755)
    (data / "shard_0000.bin").write_text("a" * 1000)
    return data


def test_a_fifo_in_the_code_folder_is_noted_and_preflight_finishes(arena):
    code = roots_code_folder_with_a_fifo(arena)

    done = subprocess.run([*CLI, "--no-probes", "--json", "--only", "code-parity,training-imports", "--code-dir",
                           str(code), "--", str(code / "train.py")], cwd=arena, env=ENV, capture_output=True,
                          text=True, timeout=120)

    assert done.returncode == 1, done.stderr[-3000:]
    results = {r["check"]: r for r in json.loads(done.stdout)["results"]}
    parity = results["code-parity"]
    assert parity["status"] == "pass"
    assert parity["summary"].endswith("; not read: train_helpers.py (a FIFO, not a regular file)")
    assert parity["details"]["skipped"] == {"train_helpers.py": "a FIFO, not a regular file"}
    # Python cannot import a FIFO either: the rank would fail on its first line.
    assert results["training-imports"]["status"] == "fail"
    assert "cannot import train_helpers (train.py:1)" in results["training-imports"]["summary"]


def test_a_fifo_in_a_data_folder_is_skipped_and_preflight_finishes(arena):
    data = roots_data_folder(arena)
    os.mkfifo(data / "train_helpers.py")

    done = subprocess.run([*CLI, "--no-probes", "--json", "--only", "data-shards", "--data-dir", str(data)],
                          cwd=arena, env={**ENV, "XDG_CACHE_HOME": str(arena / "cache")}, capture_output=True,
                          text=True, timeout=120)

    assert done.returncode == 0, done.stderr[-3000:]
    [result] = json.loads(done.stdout)["results"]
    assert result["details"]["skipped"] == {"train_helpers.py": "not a regular file"}
    assert (result["status"], result["details"]["shards"]) == ("pass", 1)


def test_a_shard_swapped_for_a_fifo_after_the_listing_is_skipped_not_waited_on(arena, user, monkeypatch):
    """Between the listing (a regular file) and its hashing, the intruder puts a FIFO in its place."""
    data = user.folder(arena / "data", 0o755)
    user.file(data / "shard_0000.bin", "a" * 1000)
    user.file(data / "shard_0001.bin", "b" * 1000)
    listed = shards._walk

    def walk_then_swap(root):
        found = listed(root)
        user.run(["sh", "-c", f"rm {data / 'shard_0001.bin'} && mkfifo {data / 'shard_0001.bin'}"])
        return found
    monkeypatch.setattr(shards, "_walk", walk_then_swap)

    manifest = run_with_deadline(lambda: shards.manifest(str(data), "blake2b"))

    assert sorted(manifest["files"]) == ["shard_0000.bin"]
    assert manifest["skipped"] == {"shard_0001.bin": "a FIFO, not a regular file (it changed after it was listed)"}


def test_a_fifo_among_the_sources_given_to_scan_is_noted(arena, user):
    code = code_folder_with_a_fifo(arena, user)

    found = run_with_deadline(lambda: scan_collectives(str(code)))

    assert found["unreadable"] == ["train_helpers.py: a FIFO, not a regular file"] and found["files"] == 1


def test_a_fifo_given_as_the_config_is_one_line(arena, user):
    shared = user.folder(arena / "shared", 0o755)
    user.run(["mkfifo", str(shared / "cluster.toml")])

    done = subprocess.run([*CLI, "--config", str(shared / "cluster.toml"), "--no-probes"], cwd=arena, env=ENV,
                          capture_output=True, text=True, timeout=120)

    # The intruder's FIFO is refused for its owner (issue 34) before anything opens it.
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"ddp-preflight: error: config {shared}/cluster.toml is refused: it belongs to "
                           f"{user.name} (uid {user.uid}), who could change what runs as root (its [env], python and "
                           f"hosts): chown root {shared}/cluster.toml, or give a config that only root can change\n")
    # Root's own FIFO (root's folder) is still one line, never waited on.
    os.mkfifo(arena / "cluster.toml")
    done = subprocess.run([*CLI, "--config", str(arena / "cluster.toml"), "--no-probes"], cwd=arena, env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert done.stderr == (f"ddp-preflight: error: config {arena}/cluster.toml is not read: a FIFO, not a regular "
                           "file; give a TOML file\n")


TRACEBACK = "Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\nRuntimeError: {}\n"


def test_explain_of_a_folder_with_a_fifo_and_a_planted_symlink_returns_and_reads_neither(arena, user):
    secret = "SECRET-" + os.urandom(6).hex()
    private = arena / "roots-own.log"
    private.write_text(TRACEBACK.format(secret))
    private.chmod(0o600)
    logs = user.folder(arena / "logs", 0o755)
    user.file(logs / "rank0.log", TRACEBACK.format("CUDA error: out of memory"))
    user.run(["mkfifo", str(logs / "rank1.log")])
    user.run(["ln", "-s", str(private), str(logs / "rank2.log")])

    done = subprocess.run([*CLI, "explain", str(logs)], cwd=arena, env=ENV, capture_output=True, text=True, timeout=120)

    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert f"not read: {logs}/rank1.log: a FIFO, not a regular file" in lines
    assert f"not read: {logs}/rank2.log: a symlink inside a folder, not followed (name it to read it)" in lines
    assert secret not in done.stdout + done.stderr
    assert "out of memory" in done.stdout


# --- attack 12 (the pickle): what explain reads is capped --------------------------------------------

RSS_BOUND = 100 << 20      # bytes: explain itself peaks near 20 MiB here; the dump is 400 MiB (it took 418 MiB)

# VmHWM: this process's own peak (ru_maxrss would also count the parent it was spawned from).
MEASURE = """
import re, sys
from ddp_preflight.cli.explain import main
code = main(sys.argv[1:])
peak = int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
print("peak", peak, code)
"""


def test_a_400_mb_dump_given_to_explain_is_not_read_and_costs_no_memory(arena, user):
    shared = user.folder(arena / "shared", 0o755)
    dump = shared / "nccl-dump-1.pickle"
    # What the intruder leaves: a pickle's first bytes, then 400 MB (sparse: no disk is used).
    user.run(["sh", "-c", f"printf '\\200\\004' > {dump} && truncate -s 400M {dump}"])

    done = subprocess.run([sys.executable, "-c", MEASURE, str(dump)], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=120)

    assert done.returncode == 0, done.stderr[-3000:]
    word, rss, code = done.stdout.split()
    assert int(rss) < RSS_BOUND, f"explain took {int(rss) >> 20} MiB"
    # Nothing was read: unreadable input, exit 2 (was "no failure found in 0 inputs", exit 0)
    assert f"(1 not read: {dump}: a Flight Recorder dump (a pickle) of 400 MiB: over 64 MiB, the most read of one" \
        in done.stderr
    assert code == "2"


def test_documents_past_the_total_are_said_not_read(arena, monkeypatch):
    """Every JSON document is read (its kind, then its content) up to DOCUMENTS_LIMIT in all."""
    from ddp_preflight.explain import explain, inputs

    monkeypatch.setattr(inputs, "DOCUMENTS_LIMIT", 3000)
    for n in range(3):
        (arena / f"error-rank-{n}.json").write_text(json.dumps({"message": {"message": "x" * 1000, "extraInfo": {}}}))
    size = size_text((arena / "error-rank-0.json").stat().st_size)

    text = as_text(explain([str(arena)]))

    assert (f"not read: {arena}/error-rank-2.json: a JSON document of {size}: 2.9 KiB of documents were "
            "read already, the most read in all") in text.splitlines()


# --- attack 8: the facts program dies with its master ----------------------------------------------

# A git that never answers (a hung mount, a lock): the collector is stuck in it. It forks a sleep
# that keeps the pipes, as real stuck children do, so that killing the git alone frees nothing.
STUCK_GIT = """#!/bin/sh
echo "$$ $PPID" > {pids}
sleep 1000 &
echo "$!" >> {pids}
wait
"""

MASTER = """
import os, sys
from ddp_preflight.transport.local import LocalNode
LocalNode("local", sys.executable).collect({"code_dir": sys.argv[1], "env": {"PATH": sys.argv[2] + ":" + os.environ["PATH"]},
                                             **({"lease": float(sys.argv[3])} if len(sys.argv) > 3 else {})})
"""


def stuck_facts(arena: Path, *lease: str) -> tuple[subprocess.Popen, list[int], Path]:
    """A master whose facts program is stuck in git: (the master, [facts, git, its sleep], the
    master's TMPDIR, where the facts program's private folder is)."""
    fake = arena / "bin"
    fake.mkdir()
    pids = arena / "git.pids"
    (fake / "git").write_text(STUCK_GIT.format(pids=pids))
    (fake / "git").chmod(0o755)
    (arena / "code").mkdir()
    tmp = arena / "tmp"
    tmp.mkdir(mode=0o700)
    master = subprocess.Popen([sys.executable, "-c", MASTER, str(arena / "code"), str(fake), *lease], cwd=REPO,
                              env={**ENV, "TMPDIR": str(tmp)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not pids.exists() or len(pids.read_text().split()) < 3:
        assert master.poll() is None and time.monotonic() < deadline, "the facts program never reached git"
        time.sleep(0.1)
    git, facts, sleep = (int(word) for word in pids.read_text().split())
    assert os.listdir(tmp), "the facts program has no private folder"
    return master, [facts, git, sleep], tmp


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def gone_within(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def end(pids: list[int]) -> None:
    """What a failed test left: the processes it started, by pid."""
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_killed_master_leaves_no_facts_program_and_no_folder(arena):
    master, pids, tmp = stuck_facts(arena)
    try:
        master.kill()
        master.wait()
        left = gone_within(pids, FACTS_LEASE)
    finally:
        end(pids)
    assert left == []
    assert os.listdir(tmp) == []


def test_a_silent_master_loses_its_facts_program_when_the_lease_runs_out(arena):
    """SIGSTOP: the master's line stays open but no heartbeat comes (a link down)."""
    master, pids, tmp = stuck_facts(arena, "3")
    try:
        master.send_signal(signal.SIGSTOP)
        left = gone_within(pids, 3 + 30)
        assert master.poll() is None          # the master is still there, only silent
    finally:
        master.kill()
        master.wait()
        end(pids)
    assert left == []
    assert os.listdir(tmp) == []


def test_a_command_killed_at_its_timeout_leaves_nothing_once_the_facts_are_in(arena):
    """The collector's own timeout (10 s) kills the git but not the child holding its pipes: that
    child is no longer the facts program's descendant, and goes with the program all the same."""
    master, pids, tmp = stuck_facts(arena)
    try:
        assert master.wait(timeout=300) == 0        # the facts came, without git's answer
        left = gone_within(pids, FACTS_LEASE)
    finally:
        end(pids)
    assert left == []
    assert os.listdir(tmp) == []


# --- the red team's variants: what explain and code-parity walk and read is bounded too -------------

# The intruder's own Python (root's venv is not theirs to run): a chain of folders made one at a time
# relative to the last (a path of 1,200 folders is longer than mkdir -p likes), a file at the bottom.
CHAIN = """
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
for _ in range(int(sys.argv[2])):
    os.mkdir("d", dir_fd=fd)
    below = os.open("d", os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = below
out = os.open(sys.argv[3], os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
os.write(out, sys.argv[4].encode())
"""


@pytest.fixture
def chain(user):
    """chain(top, depth, name, text): `depth` folders named d, one in the other, under the intruder's
    `top`, with `name` at the bottom; the first folder a walk of 64 levels does not enter. Removed
    after by rm (shutil.rmtree recurses as deep as the chain)."""
    made: list[Path] = []

    def make(top: Path, depth: int, name: str, text: str) -> Path:
        user.run(["/usr/bin/python3", "-c", CHAIN, str(top), str(depth), name, text])
        made.append(top / "d")
        return top.joinpath(*["d"] * 65)
    yield make
    for path in made:
        subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False, timeout=120)


def explain_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "explain", *args], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)


def test_explain_of_a_json_document_nested_200000_deep_says_so_and_explains_the_rest(arena, user):
    logs = user.folder(arena / "logs", 0o755)
    user.file(logs / "rank0.log", TRACEBACK.format("CUDA error: out of memory"))
    user.file(logs / "error-rank-1.json", "[" * 200_000 + "]" * 200_000)
    user.file(logs / "result.json", '{"a":' * 200_000 + "1" + "}" * 200_000)

    done = explain_cli(str(logs))

    assert done.returncode == 1, done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert f"not read: {logs}/error-rank-1.json: a JSON document nested too deep to read" in lines
    assert f"not read: {logs}/result.json: a JSON document nested too deep to read" in lines
    assert "out of memory" in done.stdout


def test_explain_of_a_folder_chain_1200_deep_notes_it_and_explains_the_rest(arena, user, chain):
    logs = user.folder(arena / "logs", 0o755)
    user.file(logs / "rank0.log", TRACEBACK.format("CUDA error: out of memory"))
    first_not_entered = chain(logs, 1200, "rank1.log", TRACEBACK.format("deep down"))

    done = explain_cli(str(logs))

    assert done.returncode == 1, done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert f"not read: {first_not_entered}: a folder deeper than 64 levels, not entered" in lines, lines
    assert "out of memory" in done.stdout and "deep down" not in done.stdout


def test_a_code_folder_chain_1200_deep_is_noted_and_code_parity_finishes(arena, user, chain):
    code = user.folder(arena / "code", 0o755)
    user.file(code / "train.py", "print('train')\n")
    chain(code, 1200, "deep.py", "x = 1\n")

    done = subprocess.run([*CLI, "--no-probes", "--json", "--only", "code-parity", "--code-dir", str(code)],
                          cwd=arena, env=ENV, capture_output=True, text=True, timeout=120)

    assert done.returncode == 0, done.stderr[-3000:]
    [parity] = json.loads(done.stdout)["results"]
    deep = "/".join(["d"] * 65)
    assert parity["status"] == "pass", parity
    assert parity["details"]["skipped"] == {deep: "a folder deeper than 64 levels, not entered"}
    assert parity["summary"].endswith(f"; not read: {deep} (a folder deeper than 64 levels, not entered)")


# Explain in a child, and the bytes it read (rchar of /proc/self/io: every read() it made).
READ_BYTES = """
import re, sys
from ddp_preflight.cli.explain import main
code = main(sys.argv[1:])
read = int(re.search(r"rchar: (\\d+)", open("/proc/self/io").read()).group(1))
print("read", read, code)
"""


def test_explain_of_a_1_tib_sparse_log_reads_its_first_and_last_part_only(arena, user):
    logs = user.folder(arena / "logs", 0o755)
    log = logs / "worker1.log"
    head = "".join(f"[worker1 r1] step {n} loss 0.5\n" for n in range(300))     # 9 KiB: it reads as text
    tail = "\n" + "".join(f"[worker1 r1] {line}\n" for line in TRACEBACK.format("CUDA error: out of memory").splitlines())
    # What the intruder leaves: a log's first line, 1 TiB of hole (4 KiB on disk), its failure at the end.
    user.run(["sh", "-c", f"printf '%s' \"$1\" > {log} && truncate -s 1T {log} && printf '%s' \"$2\" >> {log}",
              "sh", head, tail])

    done = subprocess.run([sys.executable, "-c", READ_BYTES, str(logs)], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=600)

    assert done.returncode == 0, done.stderr[-3000:]
    *shown, last = done.stdout.splitlines()
    word, read, code = last.split()
    assert code == "1" and int(read) < (1 << 30) + (16 << 20), f"explain read {int(read) >> 20} MiB of a 1 TiB log"
    assert (f"not read: {log}: the middle of a log of {size_text(log.stat().st_size)} (read its first 512 MiB and "
            "its last 512 MiB)") in shown, shown
    assert size_text(log.stat().st_size) == "1.0 TiB"
    assert "out of memory" in done.stdout


# --- the red team's variants (issue 23, second round) -----------------------------------------------

def test_a_log_dir_whose_folder_has_an_acl_for_the_intruder_is_refused(arena, user):
    """root's folder, mode 0755 as ls shows it but for its `+`: `setfacl -m u:ddpp-intruder:rwx`."""
    from tests.acl import grant

    shared = arena / "shared"
    shared.mkdir(mode=0o755)
    grant(shared, user.uid)
    user.run(["mkdir", str(shared / "theirs")])        # the ACL is real: the intruder adds names there
    before = listing(shared)

    # The run's own folder: a folder made inside it (run1) would be root's and held open, as in
    # a folder of the intruder's (above); the folder the logs go in must be writable by root alone.
    run = launch(arena, TRAIN, shared)
    out, err = run.communicate(timeout=300)

    assert (run.returncode, out) == (2, ""), err[-3000:]
    assert err == (f"ddp-preflight: error: cannot write the logs in {shared}: {shared} is writable by other users "
                   "(mode 775, with an ACL): give --log-dir a folder that no other user can change\n")
    assert listing(shared) == before


def test_a_log_dir_whose_folder_has_a_default_acl_for_the_intruder_is_refused(arena, user):
    """A default ACL: what root makes there (the run's files) would let the intruder write them."""
    from tests.acl import grant_default

    shared = arena / "shared"
    shared.mkdir(mode=0o755)
    grant_default(shared, user.uid)

    run = launch(arena, TRAIN, shared)
    out, err = run.communicate(timeout=300)

    assert (run.returncode, out) == (2, ""), err[-3000:]
    assert err == (f"ddp-preflight: error: cannot write the logs in {shared}: {shared} is writable by other users "
                   "(mode 755, with an ACL): give --log-dir a folder that no other user can change\n")
    assert listing(shared) == []


# ~/.nccl.conf and NCCL_CONF_FILE: read bounded, from this user's own home (not HOME).

def test_nccl_conf_that_is_a_fifo_or_a_device_is_skipped_not_waited_on(arena, user, monkeypatch):
    from ddp_preflight.node.facts import gpu

    shared = user.folder(arena / "shared", 0o755)
    user.run(["mkfifo", str(shared / "nccl.conf")])
    user.run(["ln", "-s", "/dev/zero", str(shared / "zero.conf")])
    try:
        monkeypatch.setenv("NCCL_CONF_FILE", str(shared / "nccl.conf"))
        fifo = run_with_deadline(gpu.nccl_conf, 30)
        monkeypatch.setenv("NCCL_CONF_FILE", str(shared / "zero.conf"))
        zero = run_with_deadline(gpu.nccl_conf, 30)
    finally:
        with contextlib.suppress(OSError):
            os.close(os.open(shared / "nccl.conf", os.O_WRONLY | os.O_NONBLOCK))

    assert fifo["skipped"] == {f"{shared}/nccl.conf": "a FIFO, not a regular file"}
    assert zero["skipped"] == {f"{shared}/zero.conf": "a device, not a regular file"}
    assert f"{shared}/nccl.conf" not in fifo["files"] and f"{shared}/zero.conf" not in zero["files"]


def test_the_nccl_conf_of_the_home_root_is_given_is_not_read(user, monkeypatch):
    from ddp_preflight.node.facts import gpu

    conf = user.home / ".nccl.conf"
    user.run(["sh", "-c", f"echo NCCL_SOCKET_IFNAME=intruders0 > {conf}"])
    try:
        monkeypatch.delenv("NCCL_CONF_FILE", raising=False)
        monkeypatch.setenv("HOME", str(user.home))
        found = run_with_deadline(gpu.nccl_conf, 30)
    finally:
        conf.unlink(missing_ok=True)

    assert str(conf) not in found["files"]
    assert found["values"].get("NCCL_SOCKET_IFNAME") != "intruders0"


# The shard cache: this user's own, never through another user's link, never believed when
# someone else wrote it.

def test_the_shard_cache_is_not_written_through_a_link_in_the_home_root_is_given(arena, user, monkeypatch):
    target, before = target_of_root(arena)
    data = arena / "data"
    data.mkdir()
    (data / "shard_0000.bin").write_bytes(b"a" * 1000)
    cache = user.home / ".cache"
    made = not cache.exists()
    user.run(["mkdir", "-p", str(cache)])
    user.run(["ln", "-sfn", str(target), str(cache / "ddp-preflight")])
    try:
        monkeypatch.setenv("HOME", str(user.home))
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
        path = shards.default_cache_path(str(data))
        shards.manifest(str(data), "blake2b", cache_path=path)
    finally:
        (cache / "ddp-preflight").unlink(missing_ok=True)
        if made:
            shutil.rmtree(cache, ignore_errors=True)
        else:
            path = shards.default_cache_path(str(data))
            if path and not path.startswith(str(user.home)):
                Path(path).unlink(missing_ok=True)          # root's own cache of this test's folder

    assert listing(target) == before


def test_a_shard_cache_the_intruder_wrote_is_not_believed(arena, user, monkeypatch):
    """A cache folder root's and sticky, as /tmp is: the intruder may add a file there, naming a
    forged digest for root's shard, under the key root's run would look up."""
    import hashlib

    data = arena / "data"
    data.mkdir()
    (data / "shard_0000.bin").write_bytes(b"root's data")
    folder = arena / "xdg" / "ddp-preflight"
    folder.mkdir(parents=True)
    folder.chmod(0o1777)
    monkeypatch.setenv("XDG_CACHE_HOME", str(arena / "xdg"))
    path = Path(shards.default_cache_path(str(data)))
    assert path.parent == folder
    shard = (data / "shard_0000.bin").stat()
    key = f"{data}/shard_0000.bin|{shard.st_size}|{shard.st_mtime_ns}|{shard.st_ino}|blake2b"
    forged = "f" * 128
    user.run(["sh", "-c", f"cat > {path}"], input=json.dumps({key: forged}))

    found = shards.manifest(str(data), "blake2b", cache_path=str(path))

    assert found["files"]["shard_0000.bin"]["digest"] == hashlib.blake2b(b"root's data").hexdigest()
    assert found["cached_files"] == 0


def test_a_cache_entry_that_is_not_a_digest_is_not_believed(arena, monkeypatch):
    import hashlib

    data = arena / "data"
    data.mkdir()
    (data / "shard_0000.bin").write_bytes(b"root's data")
    shard = (data / "shard_0000.bin").stat()
    key = f"{data}/shard_0000.bin|{shard.st_size}|{shard.st_mtime_ns}|{shard.st_ino}|blake2b"
    cache = arena / "cache.json"
    cache.write_text(json.dumps({key: "\x1b]0;owned\x07"}))

    found = shards.manifest(str(data), "blake2b", cache_path=str(cache))

    assert found["files"]["shard_0000.bin"]["digest"] == hashlib.blake2b(b"root's data").hexdigest()


# A sparse 1 TiB file in the data folder (no disk used): hashed by a sample, in bounded time.

def test_a_sparse_1_tib_file_in_the_data_folder_is_sampled_and_preflight_finishes(arena):
    data = roots_data_folder(arena)
    with open(data / "huge.bin", "wb") as huge:
        huge.truncate(1 << 40)

    started = time.monotonic()
    done = subprocess.run([*CLI, "--no-probes", "--json", "--only", "data-shards", "--data-dir", str(data)],
                          cwd=arena, env={**ENV, "XDG_CACHE_HOME": str(arena / "cache")}, capture_output=True,
                          text=True, timeout=120)
    took = time.monotonic() - started

    assert done.returncode == 0, done.stderr[-3000:]
    [result] = json.loads(done.stdout)["results"]
    assert (result["status"], result["details"]["shards"]) == ("pass", 2)
    assert result["details"]["sampled"] == {
        "huge.bin": "over 1 GiB (1 TiB): hashed by its size and its first and last 16 MiB"}
    assert took < 60, took
