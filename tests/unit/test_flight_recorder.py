"""The Flight Recorder with no change to the training script: the bootstrap every launched rank
runs (node/rank_bootstrap.py) runs the script as python does; the launch program starts it; the
agent (node/flight.py) asks a real Gloo rank, and reads a pickled NCCL dump with an unpickler that
builds plain data only. Real processes, real torch.distributed (one-process Gloo groups).

NCCL cannot run here (no GPU): its side is the recorded H100 session (artifacts/gpu-h100:
fr-dump.txt, and the shared README's last section for the pipe), played by a small process that
does what torch's C++ does there: a FIFO named TORCH_NCCL_DEBUG_INFO_PIPE_FILE + rank + ".pipe",
opened to read without blocking, looked at once a second, and on a line the dump written in
place to TORCH_FR_DUMP_TEMP_FILE + rank."""

from __future__ import annotations

import ast
import json
import os
import pickle
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ddp_preflight.node import flight, rank_bootstrap
from ddp_preflight.transport import LocalNode

from .ports import free_port

BOOTSTRAP = Path(rank_bootstrap.__file__)
ARTIFACTS = Path(__file__).parent / "artifacts" / "gpu-h100"

SHOW = """\
import json, sys
print(json.dumps({"argv": sys.argv, "name": __name__, "file": __file__, "path0": sys.path[0],
                  "spec": getattr(__spec__, "name", None), "main": sys.modules["__main__"].__dict__ is globals()}))
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 0)
"""


def run(argv, cwd, env=None):
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60, env=env)


def as_python_and_bootstrapped(args, cwd, env=None):
    """`python ARGS` and `python -u rank_bootstrap.py ARGS` (as torchrun starts a launched rank)."""
    return run([sys.executable, "-u", *args], cwd, env), run([sys.executable, "-u", str(BOOTSTRAP), *args], cwd, env)




def private_folder(path: Path) -> Path:
    path.mkdir(mode=0o700)
    return path


# -- the bootstrap runs the script as python does ----------------------------------------------

@pytest.mark.parametrize("given", ["absolute", "relative", "through a symlinked folder"])
def test_a_script_sees_no_difference(tmp_path, given):
    code = tmp_path / "code"
    code.mkdir()
    (code / "show.py").write_text(SHOW)
    (tmp_path / "link").symlink_to(code)
    path = {"absolute": str(code / "show.py"), "relative": "code/show.py",
            "through a symlinked folder": str(tmp_path / "link" / "show.py")}[given]
    python, bootstrapped = as_python_and_bootstrapped([path, "5", "--lr", "0.1"], tmp_path)
    assert bootstrapped.returncode == python.returncode == 5
    assert json.loads(bootstrapped.stdout) == json.loads(python.stdout)
    seen = json.loads(python.stdout)
    assert seen["argv"] == [path, "5", "--lr", "0.1"] and seen["name"] == "__main__" and seen["main"]
    assert seen["path0"] == str(code.resolve())
    assert bootstrapped.stderr == python.stderr == ""


def test_an_exception_gives_the_same_traceback_and_exit_code_1(tmp_path):
    (tmp_path / "fails.py").write_text("def step():\n    raise ValueError('loss is nan')\n\nstep()\n")
    python, bootstrapped = as_python_and_bootstrapped([str(tmp_path / "fails.py")], tmp_path)
    assert bootstrapped.returncode == python.returncode == 1
    assert bootstrapped.stderr == python.stderr
    assert python.stderr.startswith("Traceback (most recent call last):\n  File \"" + str(tmp_path / "fails.py"))
    assert "rank_bootstrap" not in bootstrapped.stderr


def test_sys_exit_and_a_missing_script_end_as_with_python(tmp_path):
    (tmp_path / "quits.py").write_text("import sys\nsys.exit('no data shards found')\n")
    python, bootstrapped = as_python_and_bootstrapped([str(tmp_path / "quits.py")], tmp_path)
    assert (bootstrapped.returncode, bootstrapped.stderr) == (python.returncode, python.stderr) == \
        (1, "no data shards found\n")
    python, bootstrapped = as_python_and_bootstrapped([str(tmp_path / "missing.py")], tmp_path)
    assert (bootstrapped.returncode, bootstrapped.stderr) == (python.returncode, python.stderr)
    assert python.returncode == 2


def test_dash_m_runs_a_module_as_python_does(tmp_path):
    package = tmp_path / "trainer"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "main.py").write_text(SHOW)
    (package / "broken.py").write_text("raise RuntimeError('bad config')\n")
    python, bootstrapped = as_python_and_bootstrapped(["-m", "trainer.main", "3", "x"], tmp_path)
    assert bootstrapped.returncode == python.returncode == 3
    assert json.loads(bootstrapped.stdout) == json.loads(python.stdout)
    seen = json.loads(python.stdout)
    assert seen["argv"] == [str(package / "main.py"), "3", "x"] and seen["spec"] == "trainer.main"
    assert seen["path0"] == str(tmp_path)
    for module in ("trainer.broken", "trainer.missing"):
        python, bootstrapped = as_python_and_bootstrapped(["-m", module], tmp_path)
        assert (bootstrapped.returncode, bootstrapped.stderr) == (python.returncode, python.stderr)
        assert python.returncode == 1


def test_multiprocessing_spawn_and_pickling_the_scripts_own_classes_still_work(tmp_path):
    (tmp_path / "workers.py").write_text(textwrap.dedent("""\
        import multiprocessing, pickle, sys

        class Batch:
            pass

        def square(x):
            return x * x

        if __name__ == "__main__":
            pickle.loads(pickle.dumps(Batch()))
            with multiprocessing.get_context("spawn").Pool(2) as pool:
                print(pool.map(square, [1, 2, 3]))
            sys.exit(4)
        """))
    python, bootstrapped = as_python_and_bootstrapped([str(tmp_path / "workers.py")], tmp_path)
    assert (bootstrapped.returncode, bootstrapped.stdout) == (python.returncode, python.stdout) == (4, "[1, 4, 9]\n")


# -- a Gloo rank answers the agent -------------------------------------------------------------

GLOO_RANK = """\
import time, torch, torch.distributed as dist
dist.init_process_group("gloo", rank=0, world_size=1)
t = torch.ones(2)
for _ in range(3):
    dist.all_reduce(t)
dist.barrier()
print("ready", flush=True)
time.sleep(60)
"""


def start_rank(argv, cwd, folder: Path, extra=None) -> subprocess.Popen:
    """A one-process Gloo group with the launch program's variables for its Flight Recorder."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
           "WORLD_SIZE": "1", **(extra or {})}
    env.update(flight.rank_environment(str(folder), env, nccl=False))
    rank = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, text=True)
    line = rank.stdout.readline()
    assert line == "ready\n", line + rank.stdout.read()
    return rank


def test_a_bootstrapped_gloo_rank_answers_with_its_last_collective(tmp_path):
    (tmp_path / "train.py").write_text(GLOO_RANK)
    folder = private_folder(tmp_path / "fr")
    rank = start_rank([sys.executable, "-u", str(BOOTSTRAP), str(tmp_path / "train.py")], tmp_path, folder)
    try:
        found = flight.ask(rank.pid, wait=5.0)
    finally:
        rank.kill()
        rank.wait()
    assert [(g["group"], g["seq"], g["op"]) for g in found["groups"]] == [("default_pg", 4, "barrier")], found
    assert found["entries"] == 4


def test_a_rank_folder_others_can_write_is_not_used(tmp_path):
    (tmp_path / "train.py").write_text(GLOO_RANK)
    folder = private_folder(tmp_path / "fr")
    rank = start_rank([sys.executable, "-u", str(BOOTSTRAP), str(tmp_path / "train.py")], tmp_path, folder)
    try:
        os.chmod(folder, 0o777)
        found = flight.ask(rank.pid, wait=1.0)
    finally:
        rank.kill()
        rank.wait()
    assert "not the rank's own private folder" in found["error"]
    assert not (folder / f"{rank.pid}.request").exists()


def launched(script: Path, flight_recorder: bool, port: str, module: str | None = None) -> tuple[dict, dict | None]:
    """The launch program (torchrun, one rank) on `script` (or `-m module` from its folder), as the
    launcher starts it: what the rank saw, and what the agent got when it asked for the rank's
    Flight Recorder."""
    lines: list[str] = []
    target = ["-m", module] if module else [str(script)]
    job = LocalNode("here", sys.executable).job(
        {"program": "launch", "cwd": str(script.parent), "module": bool(module), "flight_recorder": flight_recorder,
         "torchrun": ["--nproc-per-node", "1", "--master-port", port, "--tee", "3", *target, "--", "--steps", "3"]},
        timeout=120, on_line=lines.append)
    try:
        said = _wait_for(lambda: next((line for line in lines if "seen {" in line), None), 60,
                         f"the rank never started: {lines}")
        seen = json.loads(said.split("seen ", 1)[1])
        return seen, flight.ask(seen["pid"], wait=5.0)
    finally:
        job.stop()
        job.wait(30)


def test_the_launch_program_runs_every_rank_through_the_bootstrap_and_off_it_does_not(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import json, os, sys\n" + GLOO_RANK.replace(
        'print("ready", flush=True)',
        'print("seen", json.dumps({"argv": sys.argv, "file": __file__, "path0": sys.path[0], '
        '"folder": os.environ.get("DDP_PREFLIGHT_FLIGHT_RECORDER"), "pid": os.getpid()}), flush=True)'))
    port = str(free_port())
    seen, found = launched(script, True, port)
    assert seen["argv"] == [str(script), "--steps", "3"] and seen["file"] == str(script)
    assert seen["path0"] == str(tmp_path)
    folder = Path(seen["folder"])
    assert folder.name == "flight-recorder"
    assert found is not None and [(g["op"], g["seq"]) for g in found["groups"]] == [("barrier", 4)], found
    _wait_for(lambda: not folder.exists(), 10, "the run's folder outlived it")
    off, found = launched(script, False, port)
    assert (off["argv"], off["file"], off["path0"]) == (seen["argv"], seen["file"], seen["path0"])
    assert off["folder"] is None and found is None
    # -m: the module is the bootstrap's argument, not torchrun's.
    as_module, found = launched(script, True, port, module="train")
    assert (as_module["argv"], as_module["file"], as_module["path0"]) == (seen["argv"], seen["file"], seen["path0"])
    assert found is not None and [(g["op"], g["seq"]) for g in found["groups"]] == [("barrier", 4)], found


def _wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(what)


# -- pickled dumps: plain data only ------------------------------------------------------------

def recorded_h100_dump() -> dict:
    """DERIVED from artifacts/gpu-h100/fr-dump.txt (the H100's NCCL watchdog dump, printed there
    with pprint): its four printed entries, pg_config and pg_status, as the dict torch pickled.
    `version` and `comm_lib_version` were not printed: set here to stand in."""
    text = (ARTIFACTS / "fr-dump.txt").read_text()
    body = text.split("\n", 2)[2]
    entries_text, rest = body.split("pg_config: ")
    entries = [ast.literal_eval("{" + part.strip().rstrip("}") + "}") for part in entries_text.split("{")[1:]]
    pg_config, pg_status = rest.split("\npg_status: ")
    return {"version": "2.x (not recorded)", "pg_config": ast.literal_eval(pg_config),
            "comm_lib_version": "2.28.9", "pg_status": ast.literal_eval(pg_status), "entries": entries}


def test_a_real_gloo_dump_and_the_recorded_h100_one_are_read_as_plain_data(tmp_path):
    dumped = tmp_path / "dump.pkl"
    code = GLOO_RANK.replace('print("ready", flush=True)\ntime.sleep(60)\n',
                             "import torch._C._distributed_c10d as c10d\n"
                             f"open({str(dumped)!r}, 'wb').write(c10d._dump_fr_trace())\n")
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    done = run([sys.executable, "-c", code], tmp_path, env)
    assert done.returncode == 0, done.stderr
    trace = flight.plain_data(dumped.read_bytes())
    assert trace == pickle.loads(dumped.read_bytes())
    completed = max((e["collective_seq_id"] for e in trace["entries"] if e["state"] == "completed"), default=None)
    assert flight.summary(trace)["groups"] == [{"group": "default_pg", "id": "0", "seq": 4, "op": "barrier",
                                                "state": trace["entries"][-1]["state"], "completed": completed,
                                                "last": True}]
    h100 = recorded_h100_dump()
    assert len(h100["entries"]) == 4
    assert flight.summary(flight.plain_data(pickle.dumps(h100))) == {
        "groups": [{"group": "default_pg", "id": "0", "seq": 66, "op": "all_reduce", "state": "scheduled",
                    "completed": 64, "last": True, "ranks": [0]}],
        "entries": 4}


class _Runs:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_dump_that_would_call_a_function_or_holds_more_than_plain_data_is_refused(tmp_path):
    marker = tmp_path / "it-ran"
    with pytest.raises(flight.Refused, match="it would call posix.system"):
        flight.plain_data(pickle.dumps({"entries": [_Runs(marker)]}))
    assert not marker.exists()
    with pytest.raises(flight.Refused, match="it holds a set"):
        flight.plain_data(pickle.dumps({"entries": [{"frames": {1, 2}}]}))
    with pytest.raises(flight.Refused, match="it holds a bytearray"):
        flight.plain_data(pickle.dumps([bytearray(b"x")], protocol=5))
    # Shared containers are walked once: 2**60 paths, 60 lists.
    shared: list = []
    for _ in range(60):
        shared = [shared, shared]
    assert len(flight.plain_data(pickle.dumps({"entries": shared}))["entries"]) == 2


# -- an NCCL rank's pipe, as recorded on the H100 ------------------------------------------------

NCCL_RANK = """\
import os, sys, time
folder, dump = sys.argv[1], open(sys.argv[2], "rb").read()
pipe = os.environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] + os.environ["RANK"] + ".pipe"
os.mkfifo(pipe, 0o666)
fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
print("ready", flush=True)
while True:
    time.sleep(1.0)
    try:
        asked = os.read(fd, 128)
    except BlockingIOError:
        continue
    if asked:
        with open(os.environ["TORCH_FR_DUMP_TEMP_FILE"] + os.environ["RANK"], "wb") as f:
            f.write(dump[:len(dump) // 2])
            f.flush()
            time.sleep(0.3)          # caught half-written by the agent: it reads again
            f.write(dump[len(dump) // 2:])
"""


def start_nccl_rank(tmp_path, dump: bytes) -> tuple[subprocess.Popen, Path]:
    folder = private_folder(tmp_path / "fr")
    (tmp_path / "dump.pkl").write_bytes(dump)
    env = {**os.environ, "RANK": "3"}
    env.update(flight.rank_environment(str(folder), env, nccl=True))
    rank = subprocess.Popen([sys.executable, "-c", NCCL_RANK, str(folder), str(tmp_path / "dump.pkl")],
                            env=env, stdout=subprocess.PIPE, text=True)
    assert rank.stdout.readline() == "ready\n"
    return rank, folder


def test_an_nccl_rank_is_asked_through_its_pipe_and_its_dump_read(tmp_path):
    rank, folder = start_nccl_rank(tmp_path, pickle.dumps(recorded_h100_dump()))
    try:
        (folder / "nccl-dump-3").write_bytes(b"an older dump, from a timeout")   # not taken for the answer
        first = flight.ask(rank.pid, wait=1.0)
        again = flight.ask(rank.pid, wait=1.0)
    finally:
        rank.kill()
        rank.wait()
    assert first == again == {"groups": [{"group": "default_pg", "id": "0", "seq": 66, "op": "all_reduce",
                                          "state": "scheduled", "completed": 64, "last": True, "ranks": [0]}],
                              "entries": 4}


def test_an_nccl_dump_that_would_run_code_is_not_read(tmp_path):
    marker = tmp_path / "it-ran"
    rank, _ = start_nccl_rank(tmp_path, pickle.dumps({"entries": [_Runs(marker)]}))
    try:
        found = flight.ask(rank.pid, wait=1.0)
    finally:
        rank.kill()
        rank.wait()
    assert found == {"error": "the dump is not read: it would call posix.system"} and not marker.exists()


def test_the_variables_for_nccl_and_what_the_user_set_wins(tmp_path):
    folder = str(tmp_path)
    assert flight.rank_environment(folder, {}, nccl=True) == {
        "DDP_PREFLIGHT_FLIGHT_RECORDER": folder, "TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_FR_DUMP_TEMP_FILE": f"{folder}/nccl-dump-", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{folder}/nccl-pipe-"}
    mine = flight.rank_environment(folder, {"TORCH_FR_BUFFER_SIZE": "50"}, nccl=True)
    assert "TORCH_FR_BUFFER_SIZE" not in mine and mine["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "50"
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in flight.rank_environment(folder, {}, nccl=False)


SUBGROUP_RANK = """\
import json, sys, torch, torch.distributed as dist
import torch._C._distributed_c10d as c10d
dist.init_process_group("gloo", rank=0, world_size=1)
subgroup = dist.new_group([0])
t = torch.ones(2)
for _ in range(3):
    dist.all_reduce(t)                       # the default group: #1..#3
    dist.all_reduce(t, group=subgroup)       # the subgroup: its own #1..#3
dist.all_reduce(t)                           # the default group's #4: the last collective of all
sys.stdout.buffer.write(c10d._dump_fr_trace_json(True, False))
sys.stdout.flush()
dist.destroy_process_group()                 # Gloo's threads ended before exit (else an abort, now and then)
"""


def test_each_process_group_is_summarised_by_its_id_with_its_own_sequence_numbers(tmp_path):
    """A real Gloo rank with a subgroup: each group keeps its own count (the default group's #4 is
    not the subgroup's #3 plus one); the group the rank's last collective is in is marked, which is
    where a rank that waits waits (hangwatch/sequence.py compares numbers within a group only)."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "TORCH_FR_BUFFER_SIZE": "100"}
    done = run([sys.executable, "-c", SUBGROUP_RANK], tmp_path, env)
    assert done.returncode == 0, done.stderr
    found = flight.summary(json.loads(done.stdout))
    assert [(g["id"], g["group"], g["seq"], g["op"], g["last"]) for g in found["groups"]] == \
        [("0", "default_pg", 4, "all_reduce", True), ("1", "undefined", 3, "all_reduce", False)], found


@pytest.mark.parametrize("script, expected", [
    # A group that ran 3 all_reduces and a barrier, then was destroyed: the recorder keeps them.
    ("import os, torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
     "for _ in range(3):\n    dist.all_reduce(torch.ones(2))\ndist.barrier()\ndist.destroy_process_group()\n", 4),
    # torch imported, a model trained, no group: none (nanochat on CPU).
    ("import torch\nm = torch.nn.Linear(4, 4)\nm(torch.ones(4)).sum().backward()\n", 0),
    # No torch at all.
    ("print('hello')\n", 0),
])
def test_a_bootstrapped_ranks_end_record_says_how_many_collectives_it_ran(tmp_path, script, expected):
    # What a launch's end rests on for ranks seen with no connection: their own record, which a
    # group living between two of the agent's counts cannot escape.
    (tmp_path / "train.py").write_text(script)
    folder = private_folder(tmp_path / "fr")
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1"}
    env.update(flight.rank_environment(str(folder), env, nccl=False))
    done = run([sys.executable, "-u", str(BOOTSTRAP), str(tmp_path / "train.py")], tmp_path, env)
    assert done.returncode == 0, done.stderr
    ending = json.loads(next(folder.glob("*.end")).read_text())
    assert (ending["how"], ending["collectives"]) == ("returned", expected)
    # The recorder off (the user's TORCH_FR_BUFFER_SIZE=0): not known, never 0.
    if expected:
        env["TORCH_FR_BUFFER_SIZE"] = "0"
        for old in folder.glob("*.end"):
            old.unlink()
        done = run([sys.executable, "-u", str(BOOTSTRAP), str(tmp_path / "train.py")], tmp_path, env)
        assert json.loads(next(folder.glob("*.end")).read_text())["collectives"] is None
