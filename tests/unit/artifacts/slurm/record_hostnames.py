"""Re-record what Slurm's own expander prints for each host list (root, a `lab up --slurm` lab):
DDP_PREFLIGHT_LAB=LAB python tests/unit/artifacts/slurm/record_hostnames.py

Writes hostnames.json: for each list, the names `scontrol show hostnames LIST` printed, or the
line it said when it refused the list (Slurm 22.05 exits 0 then, with nothing on stdout). The
pure expander (transport/slurm_hostlist.py) is tested against it: tests/unit/test_hosts.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from ddp_preflight.lab import Lab  # noqa: E402
from ddp_preflight.lab import slurm as lab_slurm  # noqa: E402

LISTS = [
    # What Slurm itself writes (SLURM_JOB_NODELIST, NodeList): one bracket at the end of an item.
    "node[01-03,07],gpu5", "n[01-10]", "n[098-101]", "n[8-10]", "gpu[1-2],cpu[01-02],login", "tux[1,3-4],tux7",
    "gpu5", "master,worker1", "n[0]", "n[0-0]", "n[001-3]", "n[1-003]", "n[01-2]", "x-[1-2]",
    # What people type: duplicates, spaces, empty items, several brackets.
    "n[1,1,2]", "n[1-3],n[2-4]", "n[1-2],n[1-2]", "n[1-3],,n4", "n[1-2] m[3]", "rack[1-2]-n[1-3]",
    "n[1-2][3-4]", "n[1-2]x[3-4]", "n[1-2]-x[3-4]", "[1-2]x[3-4]", "x[1-2]y[3-4],z", "[1-2]", "[1-2],n",
    "a[1-2]b[1-2]c[1-2]", "a[1-3]b[1-2]c[1-2]", "a[1-2]b[1-3]c[1-2]", "a[1-2]b[1-2]c[1-3]",
    "a[1-2]b[1-2]c[1-2]d[1-2]",
    # What Slurm refuses: text after an item's last bracket, bad ranges, nested brackets.
    "node[1-3,5]-ib", "a[9-11]-ib.lan", "n[1-2]x", "n[1-2]-x", "n[1-2].lan", "n[1-2]9", "[1-2]x",
    "n[1-2],[3-4]x", "n[1-2]x[3-4]y", "a[1-2]b[1-2]c", "node[1-3];x", "node[3-1]", "n[a-c]", "n[]", "n[1-[2]]",
]

lab = Lab.open(os.environ.get("DDP_PREFLIGHT_LAB", "lab"))
env = {**os.environ, **lab_slurm.environment(lab.state)}
version = subprocess.run(["scontrol", "--version"], env=env, capture_output=True, text=True, check=True).stdout.strip()
out: dict = {"slurm": version, "lists": {}}
for hostlist in LISTS:
    done = subprocess.run(["scontrol", "show", "hostnames", hostlist], env=env, capture_output=True, text=True,
                          timeout=30)
    names = done.stdout.split()
    out["lists"][hostlist] = {"names": names} if names else {"refused": done.stderr.strip().splitlines()[-1]}
path = Path(__file__).parent / "hostnames.json"
path.write_text(json.dumps(out, indent=1) + "\n")
print(f"wrote {path}: {len(LISTS)} lists, Slurm {version}")
