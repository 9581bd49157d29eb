"""The node package, run the one way it is shipped (boot.py, the package and the spec on stdin)
on this machine: real processes, real process groups, real sockets, real torchrun."""

from __future__ import annotations

import ast
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp_preflight.node import protocol
from ddp_preflight.node.control import HEARTBEAT
from ddp_preflight.transport import LocalNode
from ddp_preflight.transport.lines import MAX_LINE, LineSplitter
from ddp_preflight.transport.node import HEARTBEATS

from .ports import free_port as _free_port

ROOT = Path(__file__).parents[2]
PIDS = re.compile(r"\bpids (\d+) (\d+)")
PID = re.compile(r"\bpid (\d+)")
NODE = ROOT / "ddp_preflight" / "node"


def local() -> LocalNode:
    return LocalNode("here", sys.executable)


def processes_with(text: str) -> list[int]:
    """PIDs whose command line holds `text`."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if text.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(int(pid))
            except OSError:
                pass
    return found


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state == "Z"


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(what)


# -- what the package is made of -------------------------------------------------------------

OPTIONAL = {"xxhash", "blake3"}                                     # used where the node has them
TORCH_MODULES = {"jobs/collectives.py", "jobs/bandwidth.py", "jobs/compute.py", "jobs/signed_store.py", "jobs/probes.py",
                 "torchjob.py",
                 "launch_runner.py", "rank_bootstrap.py", "facts/launch.py", "facts/torchinfo.py"}


OWN = protocol.__name__.rpartition(".")[0]      # the node package's import name


def test_the_node_package_imports_the_standard_library_only():
    for path in sorted(NODE.rglob("*.py")):
        rel = path.relative_to(NODE).as_posix()
        for stmt in ast.walk(ast.parse(path.read_text())):
            if isinstance(stmt, ast.Import):
                names = [a.name for a in stmt.names]
            elif isinstance(stmt, ast.ImportFrom) and stmt.level == 0:
                names = [stmt.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                # The node package by its import name, whatever package holds it.
                if top == "__future__" or top in sys.stdlib_module_names or f"{name}.".startswith(f"{OWN}."):
                    continue
                if top == "torch" and rel in TORCH_MODULES:
                    continue
                assert top in OPTIONAL, f"ddp_preflight/node/{rel} imports {name}: the node package is standard library only"


def test_a_protocol_line_round_trips():
    outcome = protocol.JobOutcome(exit=None, signal=9, timed_out=True, stopped="master-silent", seconds=1.5)
    text = protocol.line(protocol.JOB, outcome.to_json())
    assert protocol.parse(text, protocol.JOB) == outcome.to_json()
    assert protocol.JobOutcome.from_json(protocol.parse(text, protocol.JOB)) == outcome
    assert protocol.parse("step 3 loss 1.0", protocol.JOB) is None
    assert protocol.marked([text, "noise", protocol.line(protocol.JOB, {"exit": 0})], protocol.JOB)[1] == {"exit": 0}


# -- lines -------------------------------------------------------------------------------------

def test_lines_split_across_chunks_and_a_long_line_is_cut_with_its_size():
    splitter = LineSplitter(max_line=8, max_marked=64)
    assert splitter.feed(b"ab") == [] and splitter.feed(b"c\nde") == ["abc"]
    assert splitter.feed(b"fghijklmnop\n") == ["defghijk [... 5 more bytes of this line left out]"]
    marked = protocol.PREFIX + "X " + "y" * 30
    assert splitter.feed(marked.encode() + b"\n") == [marked]      # protocol lines may be long
    assert splitter.feed(b"tail") == [] and splitter.end() == ["tail"]


def test_a_200_mb_line_without_a_newline_keeps_64_kib():
    splitter, chunk = LineSplitter(), b"x" * (1 << 20)
    for _ in range(200):
        assert splitter.feed(chunk) == []
        assert splitter._kept <= MAX_LINE          # bounded while it streams, not only at the end
    [line] = splitter.feed(b"\n")
    assert line.startswith("x" * MAX_LINE) and f"{200 * (1 << 20) - MAX_LINE} more bytes" in line


# -- programs ----------------------------------------------------------------------------------

def test_the_facts_program_reports_this_machine_with_a_clock_sample():
    facts = local().collect({"sections": ["facts"], "master_port": 29500})
    assert facts["python"]["executable"] == sys.executable and facts["clock"] == {"offset": 0.0, "uncertainty": 0.0}
    assert "hostname" in facts["os"]


def test_nothing_of_a_jobs_spec_shows_in_any_process_list(tmp_path):
    secret = "s3cr3t-" + os.urandom(6).hex()
    script = tmp_path / "train.py"
    script.write_text("import os, time\nprint('seen', os.environ.get('API_TOKEN') == %r, flush=True)\n"
                      "time.sleep(30)\n" % secret)
    lines: list[str] = []
    job = local().job({"program": "launch", "cwd": str(tmp_path), "module": False,
                       "torchrun": ["--nproc-per-node", "1", "--tee", "3", str(script), "--"]},
                      env={"API_TOKEN": secret}, timeout=60, on_line=lines.append)
    try:
        wait_for(lambda: any("seen True" in line for line in lines), 30, f"the rank never saw its variable: {lines}")
        assert processes_with(secret) == []
        assert processes_with("API_TOKEN") == []
    finally:
        job.stop()
        result = job.wait(30)
    assert result.stopped == "asked" and result.error is None


def test_a_stop_ends_the_jobs_whole_process_group_and_its_private_folder(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import os, subprocess, sys, time\n"
                      "child = subprocess.Popen(['sleep', '300'])\n"
                      "print('pids', os.getpid(), child.pid, os.environ.get('TMPDIR'), flush=True)\n"
                      "time.sleep(300)\n")
    lines: list[str] = []
    job = local().job({"program": "launch", "cwd": str(tmp_path), "module": False,
                       "torchrun": ["--nproc-per-node", "1", "--tee", "3", str(script), "--"]},
                      timeout=120, on_line=lines.append)
    try:
        pids = wait_for(lambda: next((m.groups() for m in map(PIDS.search, lines) if m), None), 30,
                        f"the rank never started: {lines}")
    except AssertionError:
        job.stop()
        raise
    rank, sleeper = int(pids[0]), int(pids[1])
    # The rank's parent is the launch program (torchrun runs in it): its last word is the zip in
    # the supervisor's private folder.
    parent = Path(f"/proc/{rank}/stat").read_text().rsplit(")", 1)[1].split()[1]
    folder = Path(Path(f"/proc/{parent}/cmdline").read_bytes().split(b"\0")[-2].decode()).parent
    assert folder.name.startswith("ddp-preflight-node-") and (folder.stat().st_mode & 0o777) == 0o700
    job.stop()
    result = job.wait(30)
    assert result.stopped == "asked"
    wait_for(lambda: gone(rank) and gone(sleeper), 10, "the rank or its child outlived the stop")
    assert not folder.exists()


def test_a_rank_in_a_session_of_its_own_that_ignores_sigterm_is_still_ended(tmp_path):
    # torchrun starts each rank in a session of its own; a rank that ignores SIGTERM outlives
    # torchrun's own end at the supervisor's grace, and would be left behind, orphaned.
    script = tmp_path / "train.py"
    script.write_text("import os, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                      "os.write(1, b'pid %d\\n' % os.getpid())\ntime.sleep(300)\n")
    lines: list[str] = []
    job = local().job({"program": "launch", "cwd": str(tmp_path), "module": False,
                       "torchrun": ["--nproc-per-node", "1", "--tee", "3", str(script), "--"]},
                      timeout=120, on_line=lines.append)
    try:
        rank = int(wait_for(lambda: next((m.group(1) for m in map(PID.search, lines) if m), None), 30,
                            f"the rank never started: {lines}"))
    except AssertionError:
        job.stop()
        raise
    assert os.getsid(rank) == rank          # its own session, as torchrun makes it
    job.stop()
    job.wait(30)
    wait_for(lambda: gone(rank), 10, "the rank that ignores SIGTERM outlived its job")




STOPPED_RANKS = """\
import os, sys, time
started = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank0-started")
if os.environ["LOCAL_RANK"] == "1":
    while not os.path.exists(started):
        time.sleep(0.05)
    sys.exit(3)
os.write(1, b"pid %d\\n" % os.getpid())   # one write: the ranks share a pipe
open(started, "w").close()
time.sleep(300)
"""


def test_the_launch_program_says_which_ranks_torchrun_stops_when_one_fails(tmp_path):
    # torch 2.13: SubprocessContext._poll sees local rank 1's exit code 3 and calls close(), which
    # sends SIGTERM to the ranks still running; the agent's _stop_workers and run() close again,
    # with nothing left running: one marker, before the first.
    script = tmp_path / "train.py"
    script.write_text(STOPPED_RANKS)
    lines: list[str] = []
    job = local().job({"program": "launch", "cwd": str(tmp_path), "module": False,
                       "torchrun": ["--nproc-per-node", "2", "--master-port", str(_free_port()), "--max-restarts", "0",
                                    "--tee", "3", str(script), "--"]},
                      timeout=120, on_line=lines.append)
    result = job.wait(120)
    said = result.json_lines(protocol.LAUNCH)
    [ranks] = [m["ranks"] for m in said if m["kind"] == "ranks"]
    rank0 = int(next(m.group(1) for m in map(PID.search, lines) if m))
    assert [(r["local_rank"], r["rank"]) for r in ranks] == [(0, 0), (1, 1)] and ranks[0]["pid"] == rank0
    [stopping] = [m for m in said if m["kind"] == "stopping"]
    assert stopping["ranks"] == [{"local_rank": 0, "rank": 0, "pid": rank0}] and stopping["failed"] == [1]
    [exits] = [m for m in said if m["kind"] == "exits"]
    assert [(r["local_rank"], r["exit"], r["signal"]) for r in exits["ranks"]] == [(0, None, signal.SIGTERM), (1, 3, None)]
    kinds = [m["kind"] for m in said]
    assert kinds.index("ranks") < kinds.index("stopping") < kinds.index("exits")
    assert exits["code"] == 1 and result.exit == 1


def test_the_launch_program_says_nothing_is_stopped_when_every_rank_returns_and_all_when_it_is_stopped(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import os, time\nos.write(1, b'pid %d\\n' % os.getpid())\n"
                      "time.sleep(300 if os.path.exists('hold') else 0)\n")
    spec = {"program": "launch", "cwd": str(tmp_path), "module": False,
            "torchrun": ["--nproc-per-node", "2", "--master-port", str(_free_port()), "--max-restarts", "0",
                         str(script), "--"]}
    result = local().job(spec, timeout=120).wait(120)
    assert [m["kind"] for m in result.json_lines(protocol.LAUNCH)] == ["started", "ranks", "exits"]
    (tmp_path / "hold").touch()
    lines: list[str] = []
    job = local().job(spec, timeout=120, on_line=lines.append)
    try:
        # Until both ranks said their pid or the job ended (its own 120 s limit): no window of ours.
        wait_for(lambda: len([m for m in map(PID.search, lines) if m]) == 2 or job.program.done, 130,
                 "the job neither started its ranks nor ended")
    finally:
        job.stop()
    result = job.wait(60)
    assert len([m for m in map(PID.search, lines) if m]) == 2, f"the ranks never started: {result}"
    said = result.json_lines(protocol.LAUNCH)
    [ranks] = [m["ranks"] for m in said if m["kind"] == "ranks"]
    [stopping] = [m for m in said if m["kind"] == "stopping"]
    assert stopping["ranks"] == ranks and stopping["failed"] == []



def _state(pid: int) -> str:
    """The kernel's state letter of a process (T: stopped), or '' when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _sleeping_ranks(tmp_path, ranks: int, lines: list[str]):
    """The launch program with ranks that print their pid and sleep; its lines go into `lines`."""
    script = tmp_path / "train.py"
    script.write_text("import os, time\nos.write(1, b'pid %d\\n' % os.getpid())\ntime.sleep(300)\n")
    spec = {"program": "launch", "cwd": str(tmp_path), "module": False,
            "torchrun": ["--nproc-per-node", str(ranks), "--master-port", str(_free_port()), "--max-restarts", "0",
                         str(script), "--"]}
    return local().job(spec, timeout=120, on_line=lines.append)


def test_a_stop_prepared_freezes_every_rank_and_the_stop_then_ends_each_by_its_sigterm(tmp_path):
    # ddp-preflight's two-step stop: "prepare-stop" freezes the ranks (SIGSTOP) and says so; the
    # stop (EOF) then has torchrun send its SIGTERM, which a frozen rank dies of at once.
    lines: list[str] = []
    job = _sleeping_ranks(tmp_path, 2, lines)
    try:
        wait_for(lambda: len([m for m in map(PID.search, lines) if m]) == 2 or job.program.done, 130,
                 "the job neither started its ranks nor ended")
        pids = sorted(int(m.group(1)) for m in map(PID.search, lines) if m)
        assert len(pids) == 2, f"the ranks did not start: {lines[-20:]}"
        assert job.send({"cmd": "prepare-stop"})
        wait_for(lambda: any(line.startswith(protocol.LAUNCH) and '"frozen"' in line for line in lines)
                 or job.program.done, 60, "no frozen marker")
        assert [_state(pid) for pid in pids] == ["T", "T"]
    finally:
        job.stop()
    result = job.wait(60)
    said = result.json_lines(protocol.LAUNCH)
    [frozen] = [m["ranks"] for m in said if m["kind"] == "frozen"]
    assert sorted(r["pid"] for r in frozen) == pids
    [exits] = [m for m in said if m["kind"] == "exits"]
    assert [(r["exit"], r["signal"]) for r in exits["ranks"]] == [(None, signal.SIGTERM), (None, signal.SIGTERM)]
    assert [m["kind"] for m in said] == ["started", "ranks", "frozen", "stopping", "exits"]


def test_a_stop_prepared_before_the_launch_program_is_ready_waits_for_it(tmp_path):
    # Asked at once, before the program has set its handler (SIGUSR2 would end it): it starts with
    # the signal held, answers when ready (no rank yet: none frozen), and the run goes on until stopped.
    lines: list[str] = []
    job = _sleeping_ranks(tmp_path, 1, lines)
    try:
        assert job.send({"cmd": "prepare-stop"})
        wait_for(lambda: any(PID.search(line) for line in lines) or job.program.done, 130,
                 "the job neither started its rank nor ended")
    finally:
        job.stop()
    result = job.wait(60)
    said = result.json_lines(protocol.LAUNCH)
    assert [m["ranks"] for m in said if m["kind"] == "frozen"] == [[]]
    [exits] = [m for m in said if m["kind"] == "exits"]
    assert [(r["exit"], r["signal"]) for r in exits["ranks"]] == [(None, signal.SIGTERM)]
    assert result.signal is None, result

UNWRITABLE_STOPPING = """\
import os, sys, tempfile, time
from ddp_preflight.node import launch_runner
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, start_processes
launch_runner.watch_ranks()
def say(kind, **data):                  # the master's channel is gone when torchrun stops its ranks
    if kind == "stopping":
        raise BrokenPipeError(32, "Broken pipe")
launch_runner.say = say
context = start_processes("sleep", "sleep", {0: ("300",), 1: ("300",)}, {0: {}, 1: {}},
                          DefaultLogsSpecs(log_dir=tempfile.mkdtemp()))
print("ranks", *sorted(context.pids().values()), flush=True)
time.sleep(0.3)
context.close(timeout=10)
print("closed", flush=True)
"""


def test_torchruns_close_stops_the_ranks_even_when_the_stopping_line_cannot_be_written(tmp_path):
    out = tmp_path / "out"
    with out.open("w") as f:
        runner = subprocess.Popen([sys.executable, "-c", UNWRITABLE_STOPPING], cwd=ROOT, stdout=f,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    try:
        runner.wait(60)
    finally:
        said = out.read_text()
        ranks = [int(p) for line in said.splitlines() if line.startswith("ranks ") for p in line.split()[1:]]
        left = [pid for pid in ranks if not gone(pid)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    assert len(ranks) == 2 and not left and said.splitlines()[-1] == "closed", said[-2000:]


def test_a_silent_master_is_gone_after_the_lease(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import os, time\nos.write(1, b'pid %d\\n' % os.getpid())\ntime.sleep(300)\n")
    lines: list[str] = []
    job = local().job({"program": "launch", "cwd": str(tmp_path), "module": False,
                       "torchrun": ["--nproc-per-node", "1", "--tee", "3", str(script), "--"]},
                      timeout=120, lease=3, on_line=lines.append)
    try:
        rank = int(wait_for(lambda: next((m.group(1) for m in map(PID.search, lines) if m), None), 30,
                            f"the rank never started: {lines}"))
    except AssertionError:
        job.stop()
        raise
    HEARTBEATS.remove(job.program.process)      # as when the link is down: the stdin stays open, silent
    silent = time.monotonic()
    result = job.wait(30)
    assert result.stopped == "master-silent" and gone(rank)
    # The lease counts from the last heartbeat, which came up to a second before the silence.
    assert 3 - HEARTBEAT <= time.monotonic() - silent < 10


def test_a_listener_serves_its_token_while_strangers_hold_idle_connections():
    node, token = local(), "t" + os.urandom(8).hex()
    ready: list[dict] = []
    listener = node.job({"program": "netprobe", "mode": "listen", "address": "127.0.0.1", "count": 1,
                         "closed": 0, "token": token, "duration": 30}, timeout=40,
                        on_line=lambda line: ready.extend([protocol.parse(line, protocol.READY)]
                                                          if line.startswith(protocol.READY) else []))
    try:
        port = wait_for(lambda: ready and ready[0]["ports"][0], 20, "the listener never came up")
        assert processes_with(token) == []
        strangers = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        connect = node.job({"program": "netprobe", "mode": "connect", "token": token, "timeout": 2.5,
                            "targets": [{"dst": "here", "address": "127.0.0.1", "port": port, "kind": "listener"}]},
                           timeout=30)
        [outcome] = connect.wait(30).json_lines(protocol.RESULT)[-1]
        assert outcome["outcome"] == "open", outcome
        # The connector's own route to the address it dialled, as the facts read the route to the master.
        assert {k: outcome["route"][k] for k in ("address", "interface", "source")} == {
            "address": "127.0.0.1", "interface": "lo", "source": "127.0.0.1"}, outcome
        for s in strangers:
            s.close()
    finally:
        listener.stop()
    stats = listener.wait(20).json_lines(protocol.RESULT)[-1]
    assert sum(stats["accepted"].values()) == 1 and stats["rejected"] >= 3


def test_the_probes_rendezvous_store_listens_on_the_masters_address_only():
    seen: list[str] = []
    job = local().job({"program": "torchjob", "job": "bandwidth", "bind": "127.0.0.1", "store_token": "ab" * 16,
                       "torchrun": ["--nnodes", "1", "--nproc-per-node", "2", "--node-rank", "0",
                                    "--master-addr", "127.0.0.1", "--master-port", "29631", "--max-restarts", "0"],
                       "args": ["--backend", "gloo", "--device", "cpu"]}, timeout=90,
                      on_line=seen.append, env={"OMP_NUM_THREADS": "1"})
    listening = wait_for(lambda: [line for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
                                  if line.split()[1].endswith(":%04X" % 29631) and line.split()[3] == "0A"], 60,
                         f"the store never listened: {seen[-5:]}")
    result = job.wait(90)
    assert result.ok, (result.error, result.stderr[-2000:])
    assert all(line.split()[1].startswith("0100007F:") for line in listening), listening    # 127.0.0.1, not 0.0.0.0
    assert result.json_lines(protocol.BANDWIDTH)


# Node programs started here carry this in their environment (they inherit it): the check below
# counts them only, not those of other tests running on this machine at the same time.
TAG = f"test-{os.getpid()}-{os.urandom(4).hex()}"
os.environ["DDP_PREFLIGHT_TEST_TAG"] = TAG


def ours() -> set[int]:
    found = set()
    for pid in processes_with("ddp_preflight.node.programs"):
        try:
            if f"DDP_PREFLIGHT_TEST_TAG={TAG}".encode() in Path(f"/proc/{pid}/environ").read_bytes():
                found.add(pid)
        except OSError:
            pass
    return found


@pytest.fixture(autouse=True)
def _no_stray_children():
    before = ours()
    yield
    deadline = time.monotonic() + 10
    while ours() - before and time.monotonic() < deadline:
        time.sleep(0.1)
    left = ours() - before
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"node programs left running: {left}"
