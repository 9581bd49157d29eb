"""A CUDA run asked of the lab's CPU nodes (issue 13): device-dtype fails on every node, and the
probes start no job that cannot work: they skip, naming device-dtype, and no result offers the
firewall fix for a cause nobody saw."""

from __future__ import annotations

from .test_preflight_lab import by
from .test_probes_collectives import settled, snapshot, timed

CUDA = ("--device", "cuda", "--backend", "nccl", "--nproc-per-node", "2")
PROBED = ("collectives", "bandwidth", "compute-balance")


def test_a_cuda_run_on_cpu_nodes_starts_no_probe_job_and_offers_no_firewall_fix(clean_lab):
    before = snapshot(clean_lab)
    _, report, seconds = timed(clean_lab, *CUDA, expect=1)
    for node in ("master", "worker1"):
        dtype = by(report, "device-dtype", node)
        assert dtype["status"] == "fail" and dtype["summary"] == f"{node}'s torch has no nccl backend (it has: gloo)"
    for check in PROBED:
        [result] = by(report, check)
        assert (result["status"], result["summary"], result["fix"]) == \
            ("skip", "not probed: no node has a CUDA device (see device-dtype)", None)
    fixes = " ".join(r["fix"] or "" for r in report["results"])
    assert not [w for w in ("ephemeral", "firewall", "ufw") if w in fixes], fixes
    assert not [r for r in report["results"] if "CUDA error" in r["summary"]]
    # No torchrun started: the whole run is the facts and the checks (before: 43 s, jobs that failed).
    assert seconds < 20
    assert settled(clean_lab, before) == before

