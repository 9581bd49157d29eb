"""Re-record the facts artifacts from a running lab (root):
[DDP_PREFLIGHT_LAB=LAB] [DDP_PREFLIGHT_NPROC=N] [DDP_PREFLIGHT_PYTHONS=NODE=PATH,...] \
    python tests/unit/artifacts/record.py NAME [PROBE,...]

Writes NAME.json: the real facts each lab node reported, as the checks receive them."""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from ddp_preflight.lab import Lab  # noqa: E402
from ddp_preflight.preflight.model import Options  # noqa: E402
from ddp_preflight.preflight.probes.run import run_probes  # noqa: E402
from ddp_preflight.preflight.cluster import Cluster, Target, gather  # noqa: E402

lab = Lab.open(os.environ.get("DDP_PREFLIGHT_LAB", "lab"))
# A node's own training Python (a wrapper that sets its environment, as lab_compute_straggler's)
pythons = dict(p.split("=", 1) for p in os.environ.get("DDP_PREFLIGHT_PYTHONS", "").split(",") if p)
targets = [Target(n.name, pythons.get(n.name, sys.executable), str(lab.state.data_dir)) for n in lab.nodes]
nproc = int(os.environ.get("DDP_PREFLIGHT_NPROC", "1"))     # ranks per node the probes plan for
request = {"master_port": 29500, "master_addr": None, "nnodes": len(targets), "nproc_per_node": nproc,
           "launch_args": ["-m", "scripts.base_train", "--run=x", "--depth", "4"]}
probe_names = sys.argv[2].split(",") if len(sys.argv) > 2 else []
with Cluster(targets, str(lab.ssh_config)) as cluster:
    nodes, master_addr = gather(cluster, request)
    options = Options(master_addr=master_addr, data_dir=str(lab.state.data_dir), nproc_per_node=nproc)
    probes = run_probes(probe_names, cluster, tuple(nodes), options) if probe_names else {}
out = {"faults": lab.status()["nodes"], "master_addr": master_addr, "nproc_per_node": nproc, "probes": probes,
       "nodes": [{"node": n.node, "facts": dict(n.facts), "error": n.error, "fix": n.fix} for n in nodes]}
path = Path(__file__).parent / f"{sys.argv[1]}.json"
path.write_text(json.dumps(out, indent=1, default=str) + "\n")
print(f"wrote {path} ({path.stat().st_size} bytes)")
