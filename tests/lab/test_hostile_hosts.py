"""Issue 23, attack 13: `--slurm-job` of a job root may not use, on a real Slurm (`lab up
--slurm`). The second user (tests/hostile.py) submits a job with sbatch; root runs `hangwatch
attach --slurm-job ID` and `ddp-preflight --slurm-job ID` on it. What Slurm really does: it runs
a step in a job only for the job's own user, root included (`srun: error: Unable to create step
for job N: Access/permission denied`, Slurm 22.05). So the tools answer in one line with that
reason and the fix, exit 2, within seconds: never a BrokenPipeError traceback or a 60 s wait.
The same for a job that has ended and a job Slurm does not know; and if srun is started anyway
(a library caller), each node says srun's words at once."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp_preflight.lab import Lab
from ddp_preflight.lab import slurm as lab_slurm
from ddp_preflight.transport import NodeError
from ddp_preflight.transport.slurm import SlurmJob, SlurmNode, SlurmStep
from tests.hostile import hostile_user

REPO = Path(__file__).resolve().parents[2]
BOUND = 10.0            # seconds: scontrol answers in milliseconds; the tools' start is the rest


@pytest.fixture(scope="module")
def slurm_lab():
    name = "h" + secrets.token_hex(3)
    lab, _ = Lab.up(name, nodes=2, with_slurm=True)
    yield lab
    Lab.down(name)


def slurm_env(lab) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "DDP_PREFLIGHT_SSH_CONFIG"}
    return {**env, **lab_slurm.environment(lab.state)}


def tool(lab, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    """`ddp-preflight` or `hangwatch` (as their console scripts start them), as root; and how long
    it took."""
    module, rest = args[0], args[1:]
    argv = [sys.executable, "-P", "-c", f"import sys; sys.path.insert(0, {str(REPO)!r}); "
            f"from ddp_preflight.cli.{module} import main; sys.exit(main())", *rest]
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=slurm_env(lab), timeout=180)
    return done, time.monotonic() - started


def one_line(done: subprocess.CompletedProcess) -> str:
    assert (done.returncode, done.stdout) == (2, ""), (done.returncode, done.stdout[-2000:], done.stderr[-3000:])
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stderr.strip()


def state_of(lab, job: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], env=slurm_env(lab), capture_output=True,
                          text=True, timeout=30).stdout.strip()


@contextlib.contextmanager
def submitted(slurm_lab, *options: str):
    """A running job of the second user, submitted by that user with sbatch; cancelled after."""
    user = hostile_user()
    done = user.run(["sbatch", "--parsable", "-N", "2", "-o", "/dev/null", *options, "--wrap", "sleep 600"],
                    env={**user.env(), **lab_slurm.environment(slurm_lab.state)})
    job = done.stdout.strip()
    assert job.isdigit(), (done.stdout, done.stderr)
    try:
        for _ in range(300):          # the scheduler starts it within a moment: until then, PENDING
            if state_of(slurm_lab, job) == "RUNNING":
                break
            time.sleep(0.1)
        assert state_of(slurm_lab, job) == "RUNNING"
        yield user, job
    finally:
        subprocess.run(["scancel", job], env=slurm_env(slurm_lab), timeout=30)


@pytest.fixture
def intruders_job(slurm_lab):
    with submitted(slurm_lab) as found:
        yield found


TOOLS = [("hangwatch", "attach", "--for", "5", "--slurm-job"), ("ddp_preflight", "--json", "--slurm-job")]


@pytest.mark.parametrize("command", TOOLS, ids=["hangwatch", "ddp-preflight"])
def test_another_users_job_is_one_line_with_slurms_reason(slurm_lab, intruders_job, command):
    user, job = intruders_job
    done, took = tool(slurm_lab, *command, job)

    prog = command[0].replace("_", "-")
    assert one_line(done) == (f"{prog}: error: Slurm job {job} belongs to {user.name} (uid {user.uid}), not to root: "
                              f"Slurm runs a step in a job only for its own user, root too (srun: Unable to create "
                              f"step for job {job}: Access/permission denied); give one of your own running jobs "
                              f"(squeue --me), or run this as {user.name}")
    assert took < BOUND
    assert state_of(slurm_lab, job) == "RUNNING"          # the job itself is left alone


def test_what_srun_says_is_what_the_line_says(slurm_lab, intruders_job, monkeypatch):
    # The reason in the line is Slurm's: srun itself, run by root on that job, says it. And a
    # caller that starts the step anyway gets srun's words on every node at once, not a broken
    # pipe or HELLO_TIMEOUT's wait.
    _, job = intruders_job
    said = subprocess.run(["srun", "--overlap", "--jobid", job, "-N1", "true"], env=slurm_env(slurm_lab),
                          capture_output=True, text=True, timeout=60)
    assert (said.returncode, said.stderr.strip()) == (
        1, f"srun: error: Unable to create step for job {job}: Access/permission denied")

    for key, value in lab_slurm.environment(slurm_lab.state).items():
        monkeypatch.setenv(key, value)
    step = SlurmStep(SlurmJob(job, "RUNNING", ("master", "worker1")), sys.executable)
    nodes = [SlurmNode(name, sys.executable, step) for name in ("master", "worker1")]
    started = time.monotonic()
    errors = []
    try:
        for node in nodes:
            with pytest.raises(NodeError) as raised:
                node.connect()
            errors.append(raised.value.summary)
    finally:
        for node in nodes:
            node.close()
    assert time.monotonic() - started < BOUND
    assert errors == [f"{name}: the srun step ended before this node's task started: srun: error: Unable to "
                      f"create step for job {job}: Access/permission denied" for name in ("master", "worker1")]


@pytest.mark.parametrize("command", TOOLS, ids=["hangwatch", "ddp-preflight"])
def test_a_job_that_ended_and_one_slurm_does_not_know_are_one_line(slurm_lab, intruders_job, command):
    _, job = intruders_job
    subprocess.run(["scancel", job], env=slurm_env(slurm_lab), timeout=30, check=True)
    for _ in range(300):
        if not state_of(slurm_lab, job):
            break
        time.sleep(0.1)
    prog = command[0].replace("_", "-")

    done, took = tool(slurm_lab, *command, job)
    assert one_line(done) == (f"{prog}: error: Slurm job {job} is CANCELLED, not RUNNING: give a running job "
                              "(squeue --me shows ST R), or run inside an allocation (salloc -N N, or an sbatch script)")
    assert took < BOUND

    unknown = str(int(job) + 100000)
    done, took = tool(slurm_lab, *command, unknown)
    assert one_line(done) == (f"{prog}: error: --slurm-job {unknown}: scontrol show job -d -o {unknown}: "
                              "slurm_load_jobs error: Invalid job id specified; give one of your running jobs "
                              "(squeue --me lists them), or run inside an allocation (salloc -N N, or an sbatch script)")
    assert took < BOUND


# A job's name is the owner's to choose: scontrol prints it inside its `Key=value` line, so
# 'x UserId=root(0) JobState=RUNNING' read as fields made the intruder's job root's. Whose it is
# comes from squeue's fixed fields now.
FORGED_NAMES = ["x UserId=root(0) ", "x UserId=root(0) JobState=RUNNING NodeList=master UserId=root(0)"]


@pytest.mark.parametrize("name", FORGED_NAMES, ids=["userid", "several-fields"])
@pytest.mark.parametrize("command", TOOLS, ids=["hangwatch", "ddp-preflight"])
def test_a_job_name_that_spells_roots_userid_is_still_the_intruders_job(slurm_lab, command, name):
    with submitted(slurm_lab, f"--job-name={name}") as (user, job):
        shown = subprocess.run(["scontrol", "show", "job", "-o", job], env=slurm_env(slurm_lab), capture_output=True,
                               text=True, timeout=30).stdout
        assert f"JobName={name}" in shown            # what Slurm itself prints, the name inside the line
        done, took = tool(slurm_lab, *command, job)

        prog = command[0].replace("_", "-")
        assert one_line(done) == (f"{prog}: error: Slurm job {job} belongs to {user.name} (uid {user.uid}), not to "
                                  f"root: Slurm runs a step in a job only for its own user, root too (srun: Unable to "
                                  f"create step for job {job}: Access/permission denied); give one of your own running "
                                  f"jobs (squeue --me), or run this as {user.name}")
        assert took < BOUND
