"""Preflight inside a real Slurm allocation (`lab up --slurm`): every node through one srun step,
the same results as over ssh, a lab fault on the right node, a drained node in one line, and
nothing left behind (no step, no process, no port)."""

from __future__ import annotations

import json
import os
import secrets
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp_preflight.lab import Lab
from ddp_preflight.lab import slurm as lab_slurm
from ddp_preflight.preflight.checks.slurm import duration

CLI = [sys.executable, "-m", "ddp_preflight"]
GPU_CHECKS = ("gpu-visible", "nccl-parity", "gpu-memory-held", "gpu-health", "nccl-env")


@pytest.fixture(scope="module")
def slurm_lab():
    name = "s" + secrets.token_hex(3)
    lab, _ = Lab.up(name, nodes=2, with_slurm=True)
    yield lab
    Lab.down(name)


@pytest.fixture
def clean_slurm_lab(slurm_lab):
    yield slurm_lab
    slurm_lab.clear_faults()
    env = {**os.environ, **lab_slurm.environment(slurm_lab.state)}
    subprocess.run(["scontrol", "update", "nodename=worker1", "state=resume"], env=env,
                   capture_output=True, timeout=30)


def slurm_env(lab) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return {**env, **lab_slurm.environment(lab.state)}


def in_allocation(lab, tmp_path: Path, *args: str, before: str = "", report_json: bool = True,
                  cwd: Path | None = None, salloc: tuple[str, ...] = ()) -> tuple[int, dict, str, list[str]]:
    """`ddp-preflight --slurm ARGS --json` inside `salloc -N 2`: (exit code, report, stderr, the
    job's steps still listed by squeue once preflight returned)."""
    out, err, steps = tmp_path / "report.json", tmp_path / "stderr.txt", tmp_path / "steps.txt"
    command = " ".join(shlex.quote(a) for a in [*CLI, "--slurm", *(["--json"] if report_json else []), *args])
    script = (f"{before}\n{command} >{out} 2>{err}; code=$?\n"
              f"squeue -h -s -j $SLURM_JOB_ID -o '%i %j' >{steps}\nexit $code\n")
    done = subprocess.run(["salloc", "-N", "2", *salloc, "--quiet", "bash", "-c", script], env=slurm_env(lab),
                          capture_output=True, text=True, timeout=300, cwd=cwd or tmp_path)
    stderr = err.read_text() if err.exists() else done.stderr
    assert "Traceback" not in stderr, stderr
    text = out.read_text() if out.exists() else ""
    report = json.loads(text) if text.strip() and report_json else {}
    return done.returncode, report, stderr, steps.read_text().split("\n") if steps.exists() else []


def leftovers(lab, settle: float = 20.0) -> dict:
    """What a preflight could leave in the nodes: its programs, and listening ports other than the
    lab's own (sshd; slurmd; slurmctld on the master), each with the process that holds it. A
    cancelled step's processes end after scancel returns (slurmstepd kills them, and their
    listeners close as they exit): what is still there after `settle` seconds is left."""
    own = {str(p) for p in (22, lab.state.slurm["slurmd_port"], lab.state.slurm["ctld_port"])}
    deadline = time.monotonic() + settle
    while True:
        found = {}
        for node in lab.nodes:
            programs = [p for p in lab.processes(node.name) if _is_ours(p)]
            ports = lab.exec(node.name, ["ss", "-Htlnp"]).stdout.split("\n")
            extra = sorted({f"{line.split()[3].rsplit(':', 1)[1]} {' '.join(line.split()[5:])}".strip()
                            for line in ports if line.strip()
                            and line.split()[3].rsplit(":", 1)[1] not in own})
            if programs or extra:
                found[node.name] = {"programs": programs, "ports": extra}
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def _is_ours(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"import sys; exec(sys.stdin" in cmdline or b"srun" in cmdline.split(b"\0")[0]


def by(report, check, node=None):
    return [r for r in report["results"] if r["check"] == check and (node is None or r["node"] == node)]


def test_preflight_inside_salloc_is_clean_through_one_srun_step(clean_slurm_lab, tmp_path):
    lab = clean_slurm_lab
    code_dir = tmp_path / "code"
    code_dir.mkdir()
    (code_dir / "train.py").write_text("print('train')\n")
    code, report, stderr, steps = in_allocation(lab, tmp_path, "--data-dir", str(lab.state.data_dir),
                                                "--code-dir", str(code_dir), "--", "train.py",
                                                cwd=code_dir)     # the user starts it from the code's folder
    assert code == 0, (stderr, report)
    assert report["ok"] is True and report["nodes"] == ["master", "worker1"]
    gpu = [(r["check"], r["node"], r["status"]) for r in report["results"] if r["check"] in GPU_CHECKS]
    assert gpu == [(c, None, "skip") for c in GPU_CHECKS]
    bad = [r for r in report["results"] if r["status"] != "pass" and r["check"] not in GPU_CHECKS]
    # As over ssh on a clean lab: nothing to say; Gloo's own measured gaps (torch 2.13) are kept
    # with the passes, no training code being given.
    assert bad == []
    gaps = {r["details"]["op"] for r in report["results"] if r["check"] == "collectives" and "workaround" in r["details"]}
    assert gaps == {"reduce_scatter_tensor", "reduce_scatter", "isend_irecv", "all_reduce_premul_sum", "all_gather_uneven"}
    for check in ("node-reachable", "torch-parity", "address-family", "data-shards", "code-parity"):
        assert {r["node"] for r in by(report, check)} == {"master", "worker1"}
    # Reached through Slurm: each node at its NodeAddr, and the step is gone once preflight is.
    reached = by(report, "node-reachable", "worker1")[0]["summary"]
    assert reached.startswith(f"reached at {lab.node('worker1').ipv4} as worker1"), reached
    assert steps == [""], steps
    assert leftovers(lab) == {}


def test_slurms_view_salloc_n2_holds_a_cpu_per_node_for_two_ranks_and_five_minutes(clean_slurm_lab, tmp_path):
    lab = clean_slurm_lab
    seen = tmp_path / "job.txt"
    code, report, stderr, steps = in_allocation(
        lab, tmp_path, "--only", "slurm-allocation,slurm-time-left", "--nproc-per-node", "2",
        before=f"squeue -h -j $SLURM_JOB_ID -o '%i %e' >{seen}", salloc=("--time", "5"))
    assert code == 0, (stderr, report)      # warnings only
    job, end_time = seen.read_text().split()
    fix = ("salloc -N 2 --ntasks-per-node 1 --cpus-per-task 2   # or sbatch with the same options; "
           "or fewer ranks: --nproc-per-node 1")
    # salloc -N 2 holds one CPU on each node (CR_CPU); 2 ranks per node take turns on it.
    assert [(r["check"], r["status"], r["node"], r["summary"], r["fix"]) for r in report["results"]
            if r["check"] == "slurm-allocation"] == [
        ("slurm-allocation", "warn", node, f"1 CPU of Slurm job {job} on {node} for 2 ranks: the ranks take turns on it",
         fix) for node in ("master", "worker1")]
    (left,) = by(report, "slurm-time-left")
    seconds = left["details"]["seconds_left"]
    assert 0 < seconds <= 300 and left["details"]["end_time"] == end_time, left
    assert (left["status"], left["node"], left["summary"]) == (
        "warn", None, f"Slurm job {job} ends in {duration(seconds)} (at {end_time}, 00:05:00 limit): under 10 min, "
                      "Slurm will stop the training then")
    assert steps == [""], steps
    assert leftovers(lab) == {}


def test_a_lab_fault_is_caught_on_the_right_node_through_srun(clean_slurm_lab, tmp_path):
    lab = clean_slurm_lab
    lab.add_fault("vpn-ipv6@worker1")
    code, report, stderr, steps = in_allocation(lab, tmp_path, "--only", "address-family,interface-choice")
    assert code == 1, (stderr, report)
    failed = [(r["check"], r["node"]) for r in report["results"] if r["status"] == "fail"]
    assert failed == [("address-family", "worker1")], report["results"]
    result = by(report, "address-family", "worker1")[0]
    assert "10 vs 2" in result["summary"] and "tailscale0" in result["summary"]
    assert result["fix"].startswith("export GLOO_SOCKET_IFNAME=eth0")
    assert by(report, "address-family", "master")[0]["status"] == "pass"
    assert steps == [""], steps
    assert leftovers(lab) == {}


def test_a_node_slurm_drains_under_the_job_runs_with_a_warning(clean_slurm_lab, tmp_path):
    # Drained while the job holds it (ALLOCATED+DRAIN: sinfo's drng), Slurm still runs the job's
    # steps there: issue 26 saw it refused as drained. It is checked like the other, and said once.
    lab = clean_slurm_lab
    code, report, stderr, steps = in_allocation(
        lab, tmp_path, "--only", "node-reachable,torch-parity,slurm-allocation",
        before="scontrol update nodename=worker1 state=drain reason='disk errors'")
    assert code == 0, (stderr, report)
    assert {(r["check"], r["node"], r["status"]) for r in report["results"]} == {
        (check, node, "pass") for check in ("node-reachable", "torch-parity", "slurm-allocation")
        for node in ("master", "worker1")} - {("slurm-allocation", "worker1", "pass")} | {
        ("slurm-allocation", "worker1", "warn")}
    [drained] = by(report, "slurm-allocation", "worker1")
    assert drained["summary"] == ("Slurm is draining worker1 (reason: disk errors): this job's steps still run there "
                                  "to its end, but no new job will be placed on it")
    assert drained["fix"] == ("nothing for this run; for the next, an admin resumes worker1 once its cause is fixed: "
                              "scontrol update nodename=worker1 state=resume")
    assert "+DRAIN" in drained["details"]["state"]
    assert steps == [""], steps
    assert leftovers(lab) == {}


def test_lab_down_removes_its_slurm_with_a_job_running(tmp_path):
    name = "s" + secrets.token_hex(3)
    lab, _ = Lab.up(name, nodes=2, with_slurm=True)
    conf = lab_slurm.conf_path(lab.state)
    netns = [n.netns for n in lab.nodes]
    # A batch job submitted inside a node, with a step running on both nodes when the lab goes.
    job = tmp_path / "job.sh"
    job.write_text("#!/bin/sh\nsrun -N2 sleep 300\n")
    submitted = lab.exec("master", ["sbatch", "-N", "2", "-o", str(tmp_path / "out.txt"), str(job)])
    assert submitted.stdout.startswith("Submitted batch job"), submitted
    env = slurm_env(lab)
    for _ in range(100):
        steps = subprocess.run(["squeue", "-h", "-s", "-o", "%i %N"], env=env, capture_output=True,
                               text=True).stdout.split("\n")
        if any(line.endswith("master,worker1") and ".0" in line for line in steps):
            break
        subprocess.run(["sleep", "0.1"])
    else:
        pytest.fail(f"the batch job's step never ran: {steps}")
    report = Lab.down(name)
    assert report is not None and report.problems == []
    left = [p for p in os.listdir("/proc") if p.isdigit() and str(conf.parent.parent) in _cmdline(p)]
    assert left == []
    assert not conf.parent.parent.exists()
    assert [n for n in netns if os.path.exists(f"/etc/netns/{n}") or os.path.exists(f"/run/netns/{n}")] == []


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


REPO = Path(__file__).resolve().parents[2]
HANG = REPO / "examples" / "hang_train.py"


def test_launch_through_srun_names_a_rank_that_left_the_loop_and_stops_the_step(clean_slurm_lab, tmp_path):
    lab = clean_slurm_lab
    code, report, stderr, steps = in_allocation(
        lab, tmp_path, "--no-probes", "--launch", "--nproc-per-node", "2", "--stop-on-hang",
        "--log-dir", str(tmp_path / "run"), "--", str(HANG), "--steps", "500", "--fault", "leave",
        "--rank", "2", "--at", "5", report_json=False)
    assert code == 1, stderr[-3000:]
    assert "hangwatch: DEADLOCK: rank 2 left the loop: idle at hang_train.py:" in stderr, stderr[-3000:]
    assert "training stopped (hangwatch named a hang (--stop-on-hang)" in stderr, stderr[-3000:]
    assert steps == [""], steps
    assert leftovers(lab) == {}
    assert [p for n in lab.nodes for p in lab.processes(n.name) if b"hang_train.py" in _cmd(p)] == []


def test_hangwatch_attach_slurm_job_names_the_rank_of_an_sbatch_run(clean_slurm_lab, tmp_path):
    lab = clean_slurm_lab
    master = lab.node("master").ipv4
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/sh\n"
        "srun -N2 --ntasks-per-node 1 sh -c 'exec env GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 "
        f"{sys.executable} -m torch.distributed.run --nnodes 2 --nproc-per-node 1 --node-rank $SLURM_NODEID "
        f"--master-addr {master} --master-port 29517 {HANG} --steps 100000 --fault leave --rank 1 --at 20'\n")
    env = slurm_env(lab)
    # Held (PENDING, JobHeldUser) until released: hangwatch is started on a job that has not
    # started yet, as one is right after sbatch (issue 27: it was refused), and waits for it.
    job = subprocess.run(["sbatch", "--parsable", "--hold", "-N", "2", "-o", str(tmp_path / "job.out"), str(script)],
                         env=env, capture_output=True, text=True, timeout=30).stdout.strip()
    assert job.isdigit(), job
    try:
        watch = subprocess.Popen([sys.executable, "-m", "ddp_preflight.cli.hangwatch", "attach", "--slurm-job", job, "--json",
                                  "--exit-on-hang", "--for", "120", "--incident-dir", str(tmp_path / "incidents")],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
        first = watch.stderr.readline()
        assert first == f"hangwatch: Slurm job {job} is PENDING (JobHeldUser): waiting for it to start (Ctrl-C stops)\n", \
            first
        assert subprocess.run(["scontrol", "release", job], env=env, timeout=30).returncode == 0
        out, err = watch.communicate(timeout=180)
        done = subprocess.CompletedProcess(watch.args, watch.returncode, out, first + err)
        assert "Traceback" not in done.stderr, done.stderr[-3000:]
        assert done.returncode == 1, (done.stdout[-3000:], done.stderr[-3000:])
        said = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        diagnoses = [e["text"] for e in said if e["event"] == "diagnosis"]
        assert len(diagnoses) == 1 and diagnoses[0].startswith("DEADLOCK: rank 1 left the loop: idle at hang_train.py:"), \
            diagnoses
        # hangwatch's own step is gone; the job's is untouched until it is cancelled.
        steps = subprocess.run(["squeue", "-h", "-s", "-j", job, "-o", "%i"], env=env, capture_output=True,
                               text=True).stdout.split()
        assert sorted(steps) == [f"{job}.0", f"{job}.batch"], steps
    finally:
        subprocess.run(["scancel", job], env=env, timeout=30)
    for _ in range(150):
        if not subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True, text=True).stdout.strip():
            break
        subprocess.run(["sleep", "0.2"])
    assert leftovers(lab) == {}
    assert [p for n in lab.nodes for p in lab.processes(n.name) if b"hang_train.py" in _cmd(p)] == []


def _cmd(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_scancel_of_the_step_mid_run_stops_everything_and_says_so(clean_slurm_lab, tmp_path):
    lab = clean_slurm_lab
    out = tmp_path / "launch.out"
    command = " ".join(shlex.quote(a) for a in [*CLI, "--slurm", "--no-probes", "--launch", "--log-dir",
                                                str(tmp_path / "run"), "--", str(HANG), "--steps", "100000"])
    # Once training runs (a step line came back), cancel preflight's own step, as an admin would.
    script = (f"{command} >{out} 2>&1 & P=$!\n"
              f"until grep -q 'step 5 ' {out} || ! kill -0 $P 2>/dev/null; do sleep 0.2; done\n"
              "S=$(squeue -h -s -j $SLURM_JOB_ID -o '%i %j' | awk '$2==\"ddp-preflight\"{print $1}')\n"
              "scancel $S; wait $P; echo \"exit $?\"\n"
              "squeue -h -s -j $SLURM_JOB_ID -o '%i %j'\n")
    done = subprocess.run(["salloc", "-N", "2", "--quiet", "bash", "-c", script], env=slurm_env(lab),
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    said = out.read_text()
    assert "Traceback" not in said, said[-3000:]
    assert "step 5 " in said, said[-3000:]
    assert done.stdout.split("\n") == ["exit 1", ""], (done.stdout, said[-3000:])
    assert "ddp-preflight: training failed on " in said and "the srun step ended" in said, said[-3000:]
    assert leftovers(lab) == {}
    assert [p for n in lab.nodes for p in lab.processes(n.name) if b"hang_train.py" in _cmd(p)] == []
