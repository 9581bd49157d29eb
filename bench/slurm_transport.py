"""Preflight wall time through srun (one `srun --overlap` step for all nodes, transport/slurm.py)
against ssh, on the same lab nodes, in one run: 2 nodes, then 8 (goal: srun takes no longer
than ssh, ratio <= 1.0x with a little noise).

Both run the facts and the checks (--no-probes): the probes' torchrun jobs are the same work on
either transport (bench/probes.py times them). Every "machine" of the lab shares this box's
cores, so the figures are taken in alternation, several rounds, and the median is printed."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddp_preflight.lab import Lab  # noqa: E402
from ddp_preflight.lab import slurm as lab_slurm  # noqa: E402

ROUNDS = 5
NAME = "benchsl"


def slurm_env(lab: Lab) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return {**env, **lab_slurm.environment(lab.state)}


def allocate(lab: Lab, nodes: list[str]) -> str:
    done = subprocess.run(["salloc", "--no-shell", "--quiet", "-N", str(len(nodes)), "-w", ",".join(nodes),
                           "--job-name", "bench"], env=slurm_env(lab), capture_output=True, text=True, timeout=60)
    found = subprocess.run(["squeue", "-h", "-n", "bench", "-o", "%i %N"], env=slurm_env(lab),
                           capture_output=True, text=True).stdout.split("\n")
    for line in found:
        if line.strip():
            job, listed = line.split()
            expanded = subprocess.run(["scontrol", "show", "hostnames", listed], env=slurm_env(lab),
                                      capture_output=True, text=True).stdout.split()
            if expanded == nodes:
                return job
    raise SystemExit(f"no allocation of {nodes}: {done.stderr.strip()}")


def timed(lab: Lab, hosts: list[str], job: str | None) -> float:
    how = ["--slurm-job", job] if job else [*hosts, "--ssh-config", str(lab.ssh_config)]
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "ddp_preflight", *how, "--json", "--no-probes",
                           "--data-dir", str(lab.state.data_dir)],
                          capture_output=True, text=True, env=slurm_env(lab), timeout=600)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"preflight ({'srun' if job else 'ssh'}, {len(hosts)} nodes) failed on the clean lab:\n"
                         f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return took


def main() -> int:
    count = 8
    lab, _ = Lab.up(NAME, nodes=count, with_slurm=True)
    jobs: list[str] = []
    try:
        names = [n.name for n in lab.nodes]
        lines = []
        for size in (2, count):
            hosts = names[:size]
            job = allocate(lab, hosts)
            jobs.append(job)
            timed(lab, hosts, job)
            timed(lab, hosts, None)          # warm: page cache, shard cache
            srun, ssh = [], []
            for _ in range(ROUNDS):
                srun.append(timed(lab, hosts, job))
                ssh.append(timed(lab, hosts, None))
            subprocess.run(["scancel", job], env=slurm_env(lab))
            t_srun, t_ssh = statistics.median(srun), statistics.median(ssh)
            ratio = t_srun / t_ssh
            lines.append(f"preflight --no-probes on {size} nodes: srun {t_srun:.2f} s, ssh {t_ssh:.2f} s "
                         f"(median of {ROUNDS}; srun {', '.join(f'{t:.2f}' for t in srun)}; ssh "
                         f"{', '.join(f'{t:.2f}' for t in ssh)}); ratio srun/ssh = {ratio:.2f}x "
                         f"(goal <= 1.0x) {'OK' if ratio <= 1.05 else 'OVER GOAL'}")
            print(lines[-1], flush=True)
    finally:
        Lab.down(NAME)
    return 0


if __name__ == "__main__":
    sys.exit(main())
