"""Which processes the rank finder (node/ranks.py) takes for ranks, on real process trees: a rank
and the helpers it runs through shells, env, nice, subprocess and multiprocessing; ranks that a
wrapper without RANK started (srun, mpirun); two runs claiming the same RANK; a shell that
torchrun runs. Every process a test starts is ended by its PID, whatever the test found.

Other tests and other people's runs may hold ranks on this machine at the same time, so each test
compares the scan with the processes it started itself (its trees), never with the whole scan."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

from ddp_preflight.node import proc
from ddp_preflight.node.ranks import Finder

READY_WAIT = 30      # seconds for a tree's processes to start and say so
REPO = Path(__file__).parents[2]
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]

# One script for every role a process plays in these trees. It writes READY/NAME (its pid and start
# time) once it is itself (Python, past exec), then sleeps: a test scans only when every process it
# waits for is.
ROLES = '''
import multiprocessing, os, subprocess, sys, threading, time

PY = sys.executable
HERE = os.path.abspath(__file__)


def ready(folder, name):
    with open("/proc/self/stat") as f:
        start = f.read().rsplit(")", 1)[1].split()[19]
    with open(os.path.join(folder, name + ".tmp"), "w") as f:
        f.write(f"{os.getpid()} {start}")
    os.rename(os.path.join(folder, name + ".tmp"), os.path.join(folder, name))


def leaf(folder, name):
    ready(folder, name)
    time.sleep(300)


def run(folder, role, name):
    me = f"{PY} {HERE} {folder}"
    if role == "rank":              # a rank with every kind of helper
        # (a) os.system: sh -c "python ..." (dash forks, it does not exec the last command)
        threading.Thread(target=os.system, args=(f"{me} leaf {name}.a",), daemon=True).start()
        # (b) bash, then env and nice; "; true" keeps bash from exec-ing its one command
        subprocess.Popen(["bash", "-c", f"env nice {me} leaf {name}.b; true"])
        # (c) two shells deep, a Python that starts its own child with subprocess.Popen
        subprocess.Popen(f"bash -c '{me} popen {name}.c; true'; true", shell=True)
        # (d) a multiprocessing worker (spawn: a fresh Python, its parent the rank)
        multiprocessing.get_context("spawn").Process(target=leaf, args=(folder, name + ".d"), daemon=True).start()
    elif role == "rank-system":     # a rank with the helper of the measured failure only
        threading.Thread(target=os.system, args=(f"{me} leaf {name}.a",), daemon=True).start()
    elif role == "popen":
        subprocess.Popen([PY, HERE, folder, "leaf", name + ".child"])
    leaf(folder, name)


if __name__ == "__main__":
    run(*sys.argv[1:4])
'''


def _python(*args: str) -> str:
    return " ".join(shlex.quote(a) for a in (sys.executable, *args))


def _env(**extra: str) -> Dict[str, str]:
    """This process's environment without any rank variables of its own, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(extra)
    return env


def _descendants(roots: List[int]) -> Set[Tuple[int, int]]:
    """(pid, start) of the roots and everything below them, now."""
    children: Dict[int, List[int]] = {}
    starts: Dict[int, int] = {}
    for pid in proc.pids():
        st = proc.stat(pid)
        if st is not None:
            children.setdefault(st.ppid, []).append(pid)
            starts[pid] = st.start_ticks
    tree, todo = set(), [p for p in roots if p in starts]
    while todo:
        pid = todo.pop()
        tree.add((pid, starts[pid]))
        todo.extend(children.get(pid, []))
    return tree


class Trees:
    """The process trees a test starts: their pids, their roles' pids, and their end."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.ready = folder / "ready"
        self.ready.mkdir()
        self.script = folder / "roles.py"
        self.script.write_text(ROLES)
        self.roots: List[subprocess.Popen] = []

    def start(self, argv, **kwargs) -> subprocess.Popen:
        started = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kwargs)
        self.roots.append(started)
        return started

    def role(self, role: str, name: str) -> str:
        """The command line that runs `role` as NAME (for a shell)."""
        return _python(str(self.script), str(self.ready), role, name)

    def pids(self, *names: str) -> Dict[str, int]:
        """The pid of each named process, once every one of them is up."""
        deadline = time.monotonic() + READY_WAIT
        while not all((self.ready / n).exists() for n in names):
            assert time.monotonic() < deadline, f"not up: {[n for n in names if not (self.ready / n).exists()]}"
            assert all(r.poll() is None for r in self.roots), "a process of the tree ended before it was up"
            time.sleep(0.05)
        return {n: int((self.ready / n).read_text().split()[0]) for n in names}

    def all_pids(self) -> Set[int]:
        return {pid for pid, _ in _descendants([r.pid for r in self.roots])}

    def end(self):
        # Those that said they were up too, should their parents have gone first (and they been
        # reparented out of the trees).
        said = {tuple(int(v) for v in f.read_text().split()) for f in self.ready.iterdir() if not f.name.endswith(".tmp")}
        tree = _descendants([r.pid for r in self.roots]) | said
        for pid, start in tree:
            st = proc.stat(pid)
            if st is not None and st.start_ticks == start:     # still that process, not a reused pid
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for root in self.roots:
            root.wait()


@pytest.fixture
def trees(tmp_path):
    started = Trees(tmp_path)
    try:
        yield started
    finally:
        started.end()


def _ranks_among(finder: Finder, trees: Trees) -> Set[int]:
    """What one scan takes for ranks, of the processes this test started."""
    return set(finder.scan()) & trees.all_pids()


def _parent(pid: int) -> int:
    st = proc.stat(pid)
    assert st is not None
    return st.ppid


def _program(pid: int) -> str:
    return os.path.basename(proc.cmdline(pid)[0])


def _torchrun() -> Path:
    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists():
        pytest.skip("no torchrun beside this Python")
    return torchrun


def _wrapper_script(trees: Trees) -> Path:
    """A wrapper script that runs a rank (with an os.system helper) as its Python."""
    wrapper = trees.folder / "wrapper.sh"
    wrapper.write_text(f"#!/bin/sh\n{trees.role('rank-system', 'w')}\nexit $?\n")
    wrapper.chmod(0o755)
    return wrapper


def test_a_ranks_helpers_are_never_ranks_through_any_wrapper(trees, monkeypatch):
    trees.start([sys.executable, str(trees.script), str(trees.ready), "rank", "r"],
                env=_env(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0"))
    pids = trees.pids("r", "r.a", "r.b", "r.c", "r.c.child", "r.d")
    rank = pids["r"]
    # The trees are what they claim to be: a shell between the rank and each shell helper.
    assert _program(_parent(pids["r.a"])) == "sh" and _parent(_parent(pids["r.a"])) == rank
    assert _program(_parent(pids["r.b"])) == "bash" and _parent(_parent(pids["r.b"])) == rank
    bash = _parent(pids["r.c"])
    assert _program(bash) == "bash" and _program(_parent(bash)) == "sh" and _parent(_parent(bash)) == rank
    assert _parent(pids["r.c.child"]) == pids["r.c"] and _parent(pids["r.d"]) == rank
    assert all(proc.environ(p).get("RANK") == "0" for p in pids.values())     # every helper inherited RANK

    finder = Finder()
    found = _ranks_among(finder, trees)
    wrongly = {name for name, pid in pids.items() if pid in found and pid != rank}
    assert found == {rank}, f"taken for ranks as well: {sorted(wrongly)}"

    # Judged once for its life: a second scan reads nothing more of the rank or its helpers.
    read = []
    for name in ("cmdline", "environ", "netns"):
        real = getattr(proc, name)
        monkeypatch.setattr(proc, name, lambda pid, real=real: read.append(pid) or real(pid))
    assert _ranks_among(finder, trees) == {rank}
    assert not set(read) & set(pids.values()), "the rank or its helpers were looked at again"
    monkeypatch.undo()

    # A helper given by pid is a rank all the same: the user said so. And it alone (issue 34: attach
    # --pid follows exactly the processes given, never the node's other ranks).
    assert _ranks_among(Finder(given=[pids["r.a"]]), trees) == {pids["r.a"]}
    assert _ranks_among(Finder(given=[pids["r.a"], rank]), trees) == {rank, pids["r.a"]}


def test_a_python_that_a_wrapper_without_rank_started_is_a_rank(trees):
    # srun or mpirun: a shell exports RANK to the Python it runs, not to itself.
    trees.start(["sh", "-c", f"RANK=1 WORLD_SIZE=2 {trees.role('rank-system', 'r')}; true"], env=_env())
    pids = trees.pids("r", "r.a")
    wrapper = _parent(pids["r"])
    assert _program(wrapper) == "sh" and "RANK" not in proc.environ(wrapper)
    assert _ranks_among(Finder(), trees) == {pids["r"]}


def test_two_runs_claiming_the_same_rank_are_both_found(trees):
    # Two separate runs, each rank 0 with a helper that inherited RANK=0: ancestry, not the rank
    # number, says which are ranks; what two rank 0s mean is the watcher's to say.
    for run in ("one", "two"):
        trees.start(["sh", "-c", f"RANK=0 WORLD_SIZE=2 {trees.role('rank-system', run)}; true"], env=_env())
    pids = trees.pids("one", "one.a", "two", "two.a")
    assert _ranks_among(Finder(), trees) == {pids["one"], pids["two"]}


def test_the_python_a_wrapper_script_of_torchrun_runs_is_the_rank_not_the_shell(trees):
    trees.start([str(_torchrun()), "--standalone", "--nproc_per_node=1", "--no-python", str(_wrapper_script(trees))],
                env=_env())
    pids = trees.pids("w", "w.a")
    shell = _parent(pids["w"])
    assert _program(shell) == "sh" and proc.environ(shell).get("RANK") == "0"      # torchrun gave it RANK
    assert "torchrun" in " ".join(proc.cmdline(_parent(shell)))
    assert _ranks_among(Finder(), trees) == {pids["w"]}


def test_ranks_whose_environment_cannot_be_read_are_torchruns_children(trees):
    """Run by another user (nobody), the finder cannot read root's ranks' environments: torchrun's
    children are the ranks, a Python it runs directly and the shell of a wrapper script alike; what
    they run is not."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv, to run the finder as nobody")
    torchrun = _torchrun()
    trees.start([str(torchrun), "--standalone", "--nproc_per_node=1", str(trees.script), str(trees.ready),
                 "rank-system", "r"], env=_env())
    trees.start([str(torchrun), "--standalone", "--nproc_per_node=1", "--no-python", str(_wrapper_script(trees))],
                env=_env())
    pids = trees.pids("r", "r.a", "w", "w.a")
    shell = _parent(pids["w"])
    scan = ("import json; from ddp_preflight.node.ranks import Finder; "
            "print(json.dumps({pid: info['env_readable'] for pid, info in Finder().scan().items()}))")
    done = subprocess.run([*AS_NOBODY, sys.executable, "-c", scan], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env=_env(PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1"))
    assert done.returncode == 0, done.stderr
    readable = {int(pid): r for pid, r in json.loads(done.stdout).items() if int(pid) in trees.all_pids()}
    assert readable == {pids["r"]: False, shell: False}


def test_a_shell_or_timeout_whose_command_line_names_torchrun_is_no_torchrun(trees):
    # `sh -c "torchrun ... > node.log; ..."` and `timeout 600 torchrun ...`: the shell and timeout
    # stay the parent of the Python that runs torchrun, and only mention it. Taken for torchruns
    # they were a node's second torchrun that never starts a rank: at the run's end, "torchrun on
    # worker1 ..., worker1 ... has started no rank" named the master's node rank as never come.
    from .ports import free_port
    script = trees.folder / "never.py"
    script.write_text("")

    def torchrun():     # waits in its rendezvous for node rank 1, which never comes: alive, quiet
        return shlex.join([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", "0",
                           "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port",
                           str(free_port()), str(script)])
    shell = trees.start(["sh", "-c", f"{torchrun()} > {trees.folder / 'node.log'} 2>&1; true"], env=_env())
    timeout = trees.start(["sh", "-c", f"exec timeout 300 {torchrun()}"], env=_env())
    deadline = time.monotonic() + READY_WAIT
    pythons: Dict[int, int] = {}
    while len(pythons) < 2:
        assert time.monotonic() < deadline, "the torchruns did not start"
        for pid, _ in _descendants([shell.pid, timeout.pid]):
            argv = proc.cmdline(pid)
            if argv and argv[0] == sys.executable and "torch.distributed.run" in argv:
                pythons[_parent(pid)] = pid
        time.sleep(0.05)
    assert _program(timeout.pid) == "timeout" and set(pythons) == {shell.pid, timeout.pid}

    finder = Finder()
    finder.scan()
    assert set(finder.launchers) & trees.all_pids() == set(pythons.values())


SPAWNED = '''
import multiprocessing, os, sys, time


def helper():
    time.sleep(300)


def rank(i, folder):
    # a helper of its own (a DataLoader worker's way): spawned too, the store's address inherited
    multiprocessing.get_context("spawn").Process(target=helper, daemon=True).start()
    with open("/proc/self/stat") as f:
        start = f.read().rsplit(")", 1)[1].split()[19]
    with open(os.path.join(folder, f"rank{i}.tmp"), "w") as f:
        f.write(f"{os.getpid()} {start}")
    os.rename(os.path.join(folder, f"rank{i}.tmp"), os.path.join(folder, f"rank{i}"))
    time.sleep(300)


if __name__ == "__main__":
    import torch.multiprocessing as mp      # here: the spawned ranks need not import torch
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", sys.argv[2]
    mp.spawn(rank, args=(sys.argv[1],), nprocs=2)
'''


def test_the_ranks_torch_multiprocessing_spawn_started_are_found_their_numbers_unknown(trees, monkeypatch):
    # mp.spawn gives a rank its number as an argument: no RANK, no WORLD_SIZE, no torchrun. What
    # says it is a rank is how it was started and the store it is to join (env://).
    monkeypatch.setattr(sys.modules[__name__], "READY_WAIT", 240)   # three imports of torch, on a busy machine
    script = trees.folder / "spawned.py"
    script.write_text(SPAWNED)
    main = trees.start([sys.executable, str(script), str(trees.ready), "29999"], env=_env())
    pids = trees.pids("rank0", "rank1")
    assert {_parent(p) for p in pids.values()} == {main.pid}
    assert all("--multiprocessing-fork" in proc.cmdline(p) for p in pids.values())
    assert all("RANK" not in proc.environ(p) for p in pids.values())
    helpers = set()
    deadline = time.monotonic() + READY_WAIT
    while len(helpers) < 2:
        assert time.monotonic() < deadline, "the ranks' helpers did not start"
        helpers = {pid for pid, _ in _descendants(list(pids.values())) if pid not in pids.values()
                   and "--multiprocessing-fork" in proc.cmdline(pid)}
        time.sleep(0.05)

    found = Finder().scan()
    assert set(found) & trees.all_pids() == set(pids.values())
    assert [(found[p]["rank"], found[p]["world_size"], found[p]["master"]) for p in pids.values()] == \
        [(None, None, "127.0.0.1:29999")] * 2
