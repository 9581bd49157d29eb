"""Records the explain corpus beside this file: real 2-node x 2-rank torchrun jobs over Gloo on the
lab, made the way ../logs/record.py makes its logs (that script does the work: the same commands,
the same run.json), for the failures `ddp-preflight explain` names that ../logs has not.

    ddp-preflight lab up --name expl1
    DDP_LAB=expl1 .venv/bin/python tests/unit/artifacts/explain/record.py [SCENARIO ...]
    ddp-preflight lab down --name expl1

Not a test: tests/unit/test_explain.py reads what it left."""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "logs"))

import record as base  # noqa: E402

SCRIPT = HERE / "train_explain.py"
# Like the lab's firewall fault, but new inbound connections to the ephemeral ports are refused
# (a REJECT rule: an RST at once) instead of dropped.
NFT_REFUSE = """
table inet ddp_explain_refuse {{
  chain input {{
    type filter hook input priority filter; policy accept;
    ct state established,related accept
    iifname "lo" accept
    tcp dport 22 accept
    tcp dport {low}-{high} ct state new reject with tcp reset
  }}
}}
"""


def explain(*args: str) -> list[str]:
    return [str(SCRIPT), *args]


SCENARIOS = {
    "port-busy": base.Scenario(explain(), fault=f"port-busy@master:{base.PORT}", timeout=40),
    "refused": base.Scenario(explain("--timeout", "15"), timeout=60),
    "getfuture": base.Scenario(explain("--fault", "getfuture")),
    "swallowed": base.Scenario(explain("--steps", "5", "--run=test-cpu-ddp")),
    "large-timeout": base.Scenario(explain("--fault", "large", "--mb", "256", "--timeout", "3"),
                                   fault="wifi@worker1:500kbit", timeout=150, pin_interface=False),
    "uneven": base.Scenario(explain("--fault", "uneven", "--rank", "3", "--steps", "60"), timeout=45),
    # worker1's torchrun dials the store on another port: master's store waits for it (10 s: --rdzv-conf)
    "rendezvous-timeout": base.Scenario(explain(), timeout=40),
}
RENDEZVOUS_WRONG_PORT = base.PORT + 1


def torchrun(lab, node_rank, scenario):
    """../logs/record.py's command; for rendezvous-timeout, a short rendezvous and a wrong port on worker1."""
    argv = ORIGINAL_TORCHRUN(lab, node_rank, scenario)
    if scenario is SCENARIOS["rendezvous-timeout"]:
        at = argv.index("--master-port")
        if node_rank == 1:
            argv[at + 1] = str(RENDEZVOUS_WRONG_PORT)
        argv[at:at] = ["--rdzv-conf", "timeout=10"]
    return argv


ORIGINAL_TORCHRUN = base.torchrun


def main(names: list[str]) -> None:
    base.HERE, base.SCENARIOS, base.torchrun = HERE, SCENARIOS, torchrun
    base.LAB = os.environ.get("DDP_LAB", "expl1")
    lab = base.Lab.open(base.LAB)
    for name in names or list(SCENARIOS):
        refuse = name == "refused"
        if refuse:
            low, high = 32768, 60999      # the lab nodes' ip_local_port_range
            lab.exec("worker1", ["nft", "-f", "-"], input=NFT_REFUSE.format(low=low, high=high), check=True)
        try:
            base.record(lab, name)
        finally:
            if refuse:
                lab.exec("worker1", ["nft", "delete", "table", "inet", "ddp_explain_refuse"])


if __name__ == "__main__":
    main(sys.argv[1:])
