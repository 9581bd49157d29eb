"""`hangwatch attach` on torchruns started by hand on the lab's 2 nodes (2 ranks each), as a user
starts them: `torchrun ... > node.log 2>&1` from a shell on each node, or with torchrun's own
per-rank files (`--log-dir DIR --redirects 3`). The job (attach_train.py) trains until the test
says go, once hangwatch has found all four ranks: nothing here waits on a clock.

- Healthy runs watched to their end (2 ranks per torchrun, and 1, in turn): the watch ends by itself
  with "finished", exit 0, no verdict.
- A rank that crashes (SIGSEGV), raises MemoryError, or two that raise ValueError at once: the
  exact culprit set, whichever file their lines went to."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .hangjob import NODES, Watch, hangwatch, wait_until

SCRIPT = Path(__file__).parent / "attach_train.py"
WORLD = 4
pytestmark = pytest.mark.timeout(900)


@dataclass
class HandRun:
    """Two torchruns, each started by a shell on its node, their output where the user sent it."""
    lab: object
    folder: Path
    mark: str
    shells: list[subprocess.Popen] = field(default_factory=list)

    @property
    def go(self) -> Path:
        return self.folder / "go"

    def stop(self) -> None:
        for p in self.shells:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
        for node in NODES:                    # whatever of the job is left (its ranks carry the mark)
            for pid in self.lab.processes(node):
                try:
                    if self.mark.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                        os.kill(pid, signal.SIGKILL)
                except (FileNotFoundError, ProcessLookupError):
                    pass

    def wait(self, timeout: float) -> list[int | None]:
        out = []
        for p in self.shells:
            try:
                out.append(p.wait(timeout))
            except subprocess.TimeoutExpired:
                out.append(None)
        return out


def start_by_hand(lab, folder: Path, port: int, *script_args: str, per_rank: bool = False,
                  nproc: int = 2, node_ranks: tuple[int, ...] = (0, 1)) -> HandRun:
    """torchrun on each node from `sh -c`, the way a user types it: output to one file per node
    (node.log), or torchrun's per-rank files under --log-dir (--redirects 3)."""
    folder.mkdir(parents=True, exist_ok=True)
    run = HandRun(lab, folder, f"ATTACH_TRAIN_JOB={port}")
    master = lab.node("master").ipv4
    for i, node in enumerate(NODES):
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", str(nproc),
                    "--node-rank", str(node_ranks[i]), "--master-addr", master, "--master-port", str(port)]
        if per_rank:
            torchrun += ["--log-dir", str(folder / f"logs-{node}"), "--redirects", "3"]
        torchrun += [str(SCRIPT), "--go", str(run.go), *script_args]
        # cd first: the shell stays the torchrun's parent (it runs a list, not one command).
        line = f"cd {shlex.quote(str(folder))} && {shlex.join(torchrun)} > {shlex.quote(str(folder / node))}.log 2>&1"
        run.shells.append(lab.popen(node, ["env", "GLOO_SOCKET_IFNAME=eth0", "OMP_NUM_THREADS=1", run.mark,
                                           "sh", "-c", line], start_new_session=True))
    return run


def watching(lab, tmp_path: Path, *args: str) -> Watch:
    return hangwatch(lab, "--incident-dir", str(tmp_path / "incidents"), *args)


def all_found(watch: Watch, world: int = WORLD) -> None:
    wait_until(lambda: len({e["rank"] for e in watch.of("rank-found")}) == world, 120,
               f"hangwatch did not find the {world} ranks")


def ended(watch: Watch, timeout: float = 120) -> int:
    try:
        return watch.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the watch did not end with the run: {[e['text'] for e in watch.events][-15:]}") \
            from None


def test_ten_healthy_runs_started_by_hand_are_watched_to_their_end_each_exit_0(clean_lab, tmp_path):
    # Two shapes in turn: 2 ranks per torchrun (4 in all), and 1 (2 in all: no local peer to end with).
    for n in range(10):
        nproc = 2 if n % 2 == 0 else 1
        world = 2 * nproc
        run = start_by_hand(clean_lab, tmp_path / f"run{n}", 29710 + n, nproc=nproc)
        watch = watching(clean_lab, tmp_path / f"run{n}")
        try:
            all_found(watch, world)
            run.go.touch()
            code = ended(watch)
            assert run.wait(60) == [0, 0], (tmp_path / f"run{n}" / "master.log").read_text()[-2000:]
        finally:
            watch.stop()
            run.stop()
        said = [f"{e['event']}: {e['text']}" for e in watch.events]
        assert code == 0, (n, said, watch.stderr)
        assert not watch.of("diagnosis") and not watch.of("incident"), (n, said)
        assert not [e for e in watch.events if (e.get("snapshot") or {}).get("diagnosis")], (n, said)
        [finished] = watch.of("finished")
        assert finished["text"] == f"finished: all {world} ranks exited 0", (n, said)
        assert finished["finished"] is True and finished["ranks"] == list(range(world)), finished


def _culprits(clean_lab, tmp_path, port: int, fault: str, ranks: str, per_rank: bool) -> tuple[dict, int]:
    run = start_by_hand(clean_lab, tmp_path / "run", port, "--fault", fault, "--rank", ranks, per_rank=per_rank)
    watch = watching(clean_lab, tmp_path)
    try:
        all_found(watch)
        run.go.touch()
        diagnosis = watch.wait_for("diagnosis", 90)["snapshot"]["diagnosis"]
        code = ended(watch)
    finally:
        watch.stop()
        run.stop()
    return diagnosis, code


SHAPES = [("segv", "1", "killed"), ("memory", "2", "failed"), ("value", "0,3", "failed")]


@pytest.mark.parametrize("per_rank", [False, True], ids=["one-file-per-node", "per-rank-files"])
@pytest.mark.parametrize("fault,ranks,reason", SHAPES, ids=[s[0] for s in SHAPES])
def test_attached_a_failing_rank_is_named_whichever_file_its_lines_went_to(clean_lab, tmp_path, fault, ranks,
                                                                            reason, per_rank):
    port = 29730 + 2 * [s[0] for s in SHAPES].index(fault) + per_rank
    d, code = _culprits(clean_lab, tmp_path, port, fault, ranks, per_rank)
    expected = [int(r) for r in ranks.split(",")]
    assert (d["kind"], d["culprits"], d["candidates"]) == ("exited", expected, []), d["summary"]
    assert code == 1, d["summary"]


def test_two_torchruns_that_claim_one_node_rank_are_named_with_the_cause(clean_lab, tmp_path):
    # The classic sbatch mistake: `--node-rank $SLURM_NODEID` expanded once, so both nodes' torchruns
    # say node rank 0. They wait in their rendezvous for node rank 1 for ever; no rank starts.
    run = start_by_hand(clean_lab, tmp_path / "run", 29741, node_ranks=(0, 0))
    watch = watching(clean_lab, tmp_path, "--exit-on-hang")
    try:
        d = watch.wait_for("diagnosis", 90)["snapshot"]["diagnosis"]
        code = ended(watch)
    finally:
        watch.stop()
        run.stop()
    assert (d["kind"], d["reason"], d["certainty"], d["nodes"], d["node_ranks"]) == \
        ("rendezvous-stall", "duplicate-node-rank", "certain", ["master", "worker1"], [1]), d["summary"]
    assert d["summary"].startswith(f"the torchruns of the run at {clean_lab.node('master').ipv4}:29741 number their "
                                   "nodes wrong: master and worker1 both claim node rank 0 (of 2)"), d["summary"]
    assert "$SLURM_NODEID" in d["causes"][0]["what"] and code == 1


def test_with_no_rank_on_any_node_it_says_so_and_exits_2(clean_lab, tmp_path):
    watch = watching(clean_lab, tmp_path)
    code = ended(watch, 90)
    assert code == 2, (code, watch.stderr)
    assert watch.stderr.strip().splitlines()[-1] == (
        "hangwatch: no rank found on master, worker1: no process with RANK and WORLD_SIZE in its environment and no "
        "torchrun, in 3 scans of every process of each; start the training first, give a rank's process with "
        "--pid HOST:PID, or --keep-watching to wait for one"), watch.stderr
    assert not watch.of("rank-found"), watch.events


SLEEPER = "import time; time.sleep(600)"


def sleeper_on(lab, node: str, mark: str) -> int:
    """The Python with `mark` in its environment on that node, once it runs."""
    def find():
        for pid in lab.processes(node):
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if mark.encode() in env and argv[0] == sys.executable.encode():
                return pid
        return None
    return wait_until(find, 30, f"the sleeper on {node} did not start")


def test_pids_given_per_host_are_watched_on_each_host_and_named_by_their_rank(clean_lab, tmp_path):
    # Neither looks like a rank (RANK without WORLD_SIZE): only --pid makes them ranks.
    mark = f"ATTACH_SLEEPER={os.getpid()}"
    sleepers = [clean_lab.popen(node, ["env", f"RANK={rank}", mark, sys.executable, "-c", SLEEPER],
                                start_new_session=True) for node, rank in (("master", 0), ("worker1", 1))]
    try:
        pids = {node: sleeper_on(clean_lab, node, mark) for node in NODES}
        watch = watching(clean_lab, tmp_path, "--pid", f"worker1:{pids['worker1']}", "--pid", f"master:{pids['master']}")
        try:
            wait_until(lambda: len(watch.of("rank-found")) == 2, 60, "the given processes were not found")
        finally:
            watch.stop()
        assert sorted((e["node"], e["pid"], e["rank"], e["text"]) for e in watch.of("rank-found")) == [
            ("master", pids["master"], 0, f"master: found rank 0 (pid {pids['master']})"),
            ("worker1", pids["worker1"], 1, f"worker1: found rank 1 (pid {pids['worker1']})")]
    finally:
        for p in sleepers:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
        for node in NODES:
            for pid in clean_lab.processes(node):
                try:
                    if mark.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                        os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


def test_ranks_torch_multiprocessing_spawn_started_are_found_and_watched_to_their_end(clean_lab, tmp_path):
    # No torchrun, no RANK: mp.spawn's two ranks on master, found by how they were started and the
    # store they join; their numbers unknown, they are named by their processes.
    folder = tmp_path / "spawned"
    folder.mkdir()
    go, mark = folder / "go", "ATTACH_TRAIN_JOB=spawn"
    job = clean_lab.popen("master", ["env", "OMP_NUM_THREADS=1", mark, sys.executable, str(SCRIPT), "--go", str(go),
                                     "--spawn", "2", "--port", "29750"], start_new_session=True)
    watch = None
    try:
        # Attached once the ranks run, as a user attaches: before, the watch finds none and says so.
        wait_until(lambda: len(spawned(clean_lab, mark)) == 2, 180, "mp.spawn did not start the ranks")
        watch = hangwatch(clean_lab, "--incident-dir", str(tmp_path / "incidents"), hosts=("master",))
        wait_until(lambda: len(watch.of("rank-found")) == 2, 120, "the spawned ranks were not found")
        go.touch()
        code = ended(watch)
        assert job.wait(60) == 0
    finally:
        if watch is not None:
            watch.stop()
        HandRun(clean_lab, folder, mark, [job]).stop()
    assert watch is not None
    said = [f"{e['event']}: {e['text']}" for e in watch.events]
    found = watch.of("rank-found")
    assert [e["rank"] for e in found] == [None, None], said
    assert code == 0 and not watch.of("diagnosis"), (said, watch.stderr)
    [finished] = watch.of("finished")
    assert finished["text"] == "finished: all 2 ranks exited 0", said
    assert sorted(r["pid"] for r in finished["ranks"]) == sorted(e["pid"] for e in found), finished


def spawned(lab, mark: str) -> list[int]:
    """The processes multiprocessing's spawn started with `mark` in their environment, on master."""
    found = []
    for pid in lab.processes("master"):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if mark.encode() in env and b"--multiprocessing-fork" in argv:
            found.append(pid)
    return found
