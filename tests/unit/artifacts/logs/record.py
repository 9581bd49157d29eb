"""Records the logs beside this file: real 2-node x 2-rank torchrun jobs over Gloo on the lab, each
node's whole output (stdout and stderr together, as a terminal shows it) kept byte for byte.

    ddp-preflight lab up --name logs
    .venv/bin/python tests/unit/artifacts/logs/record.py [SCENARIO ...]       # all without one
    ddp-preflight lab down --name logs

Each scenario writes SCENARIO/master.log and SCENARIO/worker1.log (node ranks 0 and 1: global
ranks 0,1 on master, 2,3 on worker1) and SCENARIO/run.json: the commands, the date, torch's
version, the script's git blob hash (examples/hang_train.py changes: the lines the logs name are
those of that blob), each torchrun's exit code, and what was done to the run. A `launch-` scenario
runs `ddp-preflight master worker1 --launch` from this machine instead, and keeps the log folder's
master.log, worker1.log and result.json as the launcher wrote them. Not a test: the tests read
what it left."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
sys.path.insert(0, str(ROOT))

from ddp_preflight.lab.lab import Lab  # noqa: E402

LAB = "logs"
NODES = ("master", "worker1")
HANG_TRAIN = ROOT / "examples" / "hang_train.py"
FAULTS = HERE / "train_faults.py"
LOADER = HERE / "train_loader.py"
PORT = 29533


def hang_train(*args: str) -> list[str]:
    return [str(HANG_TRAIN), "--steps", "60", *args]


def faults(*args: str) -> list[str]:
    return [str(FAULTS), *args]


@dataclass(frozen=True)
class Scenario:
    script: list[str]                # the script and its arguments
    tee: bool = True                 # torchrun --tee 3: every rank's line prefixed "[defaultN]:"
    action: str | None = None        # done to the run once master's rank 0 printed step 10
    fault: str | None = None         # a lab fault (docs/lab.md) in place for the whole run
    timeout: float = 120             # s before the job is stopped
    pin_interface: bool = True       # GLOO_SOCKET_IFNAME=eth0 (without it, Gloo binds what the hostname resolves to)
    launch: bool = False             # through `ddp-preflight --launch` (lines "[worker1 r3] ...")


SCENARIOS: dict[str, Scenario] = {
    "raise": Scenario(hang_train("--fault", "raise", "--rank", "1", "--at", "5")),
    "raise-notee": Scenario(hang_train("--fault", "raise", "--rank", "1", "--at", "5"), tee=False),
    "exit": Scenario(hang_train("--fault", "exit", "--rank", "3", "--at", "5")),
    "quit": Scenario(hang_train("--fault", "quit", "--rank", "1", "--at", "5")),
    "quit-r3": Scenario(hang_train("--fault", "quit", "--rank", "3", "--at", "5")),
    "quit-work": Scenario(hang_train("--fault", "quit", "--rank", "1", "--at", "5", "--wait", "work")),
    "mismatch": Scenario(hang_train("--fault", "mismatch", "--rank", "1", "--at", "5"), timeout=60),
    "size": Scenario(faults("--fault", "size")),
    "sigkill": Scenario(hang_train("--steps", "100000", "--step-time", "0.2"), action="sigkill"),
    "chained": Scenario(faults("--fault", "chained")),
    "timeout": Scenario(faults("--fault", "sleep", "--timeout", "8")),
    "reset": Scenario(faults("--steps", "100000", "--timeout", "15"), action="reset", timeout=150),
    "loader": Scenario([str(LOADER)]),
    "firewall": Scenario(faults("--timeout", "15"), fault="firewall@worker1"),
    "vpn-ipv6": Scenario(faults("--timeout", "15"), fault="vpn-ipv6@worker1", pin_interface=False),
    # The same runs again, kept from a repeat in which the rank's end took the other of its two real
    # courses (README.md says how often): the leaving rank aborts, the peers read a reset.
    "exit-abort": Scenario(hang_train("--fault", "exit", "--rank", "3", "--at", "5")),
    "quit-abort": Scenario(hang_train("--fault", "quit", "--rank", "3", "--at", "5")),
    "sigkill-reset": Scenario(hang_train("--steps", "100000", "--step-time", "0.2"), action="sigkill"),
    "launch-raise": Scenario(hang_train("--fault", "raise", "--rank", "3", "--at", "5"), launch=True),
}


def torchrun(lab: Lab, node_rank: int, scenario: Scenario) -> list[str]:
    master = lab.node(NODES[0]).ipv4
    pin = ["GLOO_SOCKET_IFNAME=eth0"] if scenario.pin_interface else []
    return ["env", *pin, "OMP_NUM_THREADS=1", sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(len(NODES)), "--nproc-per-node", "2", "--node-rank", str(node_rank),
            "--master-addr", master, "--master-port", str(PORT), *(["--tee", "3"] if scenario.tee else []),
            *scenario.script]


def launcher(lab: Lab, scenario: Scenario, log_dir: Path) -> list[str]:
    return [str(Path(sys.executable).parent / "ddp-preflight"), *NODES, "--ssh-config", str(lab.ssh_config),
            "--no-probes", "--launch", "--nproc-per-node", "2", "--master-port", str(PORT), "--log-dir", str(log_dir),
            "--", *scenario.script]


def ranks_of(lab: Lab, node: str, script: Path) -> list[int]:
    """The rank processes in a node (the training script's Pythons, not torchrun)."""
    found = []
    for pid in lab.processes(node):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        if str(script).encode() in argv and b"torch.distributed.run" not in argv:
            found.append(pid)
    return sorted(found)


def wait_for_line(lines: list[str], text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(text in line for line in list(lines)):
            return
        time.sleep(0.1)
    raise TimeoutError(f"never saw {text!r}")


# Resets pass, or the resets the rules make would be rejected in turn (and dropped).
NFT_RESET = """
table inet ddp_logs_reset {{
  chain input {{
    type filter hook input priority filter; policy accept;
    tcp flags rst accept
    ip saddr {peer} tcp sport != 22 tcp dport != 22 reject with tcp reset
  }}
  chain output {{
    type filter hook output priority filter; policy accept;
    tcp flags rst accept
    ip daddr {peer} tcp sport != 22 tcp dport != 22 reject with tcp reset
  }}
}}
"""


def act(lab: Lab, action: str, lines: dict[str, list[str]], script: Path) -> dict:
    """Do to the running job what the scenario says; returns what was done, for run.json."""
    wait_for_line(lines["master"], "step 10 ", 90)
    if action == "sigkill":
        pid = ranks_of(lab, "worker1", script)[-1]      # the younger: local rank 1, global rank 3
        os.kill(pid, signal.SIGKILL)
        return {"action": "SIGKILL to a rank on worker1 mid-run (the later-started one: local rank 1)", "pid": pid,
                "t": time.time()}
    if action == "reset":
        rules = NFT_RESET.format(peer=lab.node("master").ipv4)
        lab.exec("worker1", ["nft", "-f", "-"], input=rules, check=True)
        return {"action": "nft on worker1: every TCP packet to or from master (but ssh) rejected with a tcp reset",
                "rules": rules, "t": time.time()}
    raise ValueError(action)


def undo(lab: Lab, action: str | None) -> None:
    if action == "reset":
        lab.exec("worker1", ["nft", "delete", "table", "inet", "ddp_logs_reset"])


def blob(path: str) -> str | None:
    """The script's git blob hash, as `git hash-object` gives it."""
    found = subprocess.run(["git", "hash-object", path], capture_output=True, text=True, cwd=ROOT)
    return found.stdout.strip() or None


def start(lab: Lab, scenario: Scenario, folder: Path, log_dir: Path) -> dict[str, subprocess.Popen]:
    if scenario.launch:
        out = open(folder / "launcher.out", "wb")
        return {"launcher": subprocess.Popen(launcher(lab, scenario, log_dir), cwd=ROOT, stdout=out,
                                             stderr=subprocess.STDOUT, start_new_session=True)}
    return {node: lab.popen(node, torchrun(lab, i, scenario), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True) for i, node in enumerate(NODES)}


def record(lab: Lab, name: str) -> None:
    scenario = SCENARIOS[name]
    folder = HERE / name
    folder.mkdir(exist_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix="ddp-logs-")) / "run"
    lines: dict[str, list[str]] = {node: [] for node in NODES}
    readers = []
    if scenario.fault:
        lab.add_fault(scenario.fault)
    started = datetime.datetime.now(datetime.timezone.utc)
    procs = start(lab, scenario, folder, log_dir)
    for node, proc in procs.items():
        if proc.stdout is None:
            continue

        def read(node=node, proc=proc):
            with open(folder / f"{node}.log", "wb") as f:
                for raw in proc.stdout:
                    f.write(raw)
                    f.flush()
                    lines[node].append(raw.decode(errors="replace"))
        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        readers.append(thread)
    done: dict = {}
    try:
        if scenario.action:
            done = act(lab, scenario.action, lines, Path(scenario.script[0]))
        deadline = time.monotonic() + scenario.timeout
        for p in procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    finally:
        undo(lab, scenario.action)
        if scenario.fault:
            lab.clear_faults([scenario.fault])
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(40)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for thread in readers:
            thread.join(10)
    if scenario.launch:
        for kept in ("master.log", "worker1.log", "result.json"):
            shutil.copyfile(log_dir / kept, folder / kept)
        (folder / "launcher.out").unlink()
    shutil.rmtree(log_dir.parent)
    import torch
    commands = ({"launcher": launcher(lab, scenario, Path("LOG_DIR"))} if scenario.launch else
                {node: torchrun(lab, i, scenario) for i, node in enumerate(NODES)})
    (folder / "run.json").write_text(json.dumps({
        "scenario": name, "started": started.isoformat(timespec="seconds"), "torch": torch.__version__,
        "python": sys.version.split()[0], "lab": LAB, "script": scenario.script[0], "script_blob": blob(scenario.script[0]),
        "addresses": {node: lab.node(node).ipv4 for node in NODES}, "commands": commands,
        "exit": {name: p.returncode for name, p in procs.items()},
        **({"fault": scenario.fault} if scenario.fault else {}), **({"done": done} if done else {})}, indent=1) + "\n")
    print(name, {name: p.returncode for name, p in procs.items()}, flush=True)


if __name__ == "__main__":
    the_lab = Lab.open(LAB)
    for scenario_name in sys.argv[1:] or list(SCENARIOS):
        record(the_lab, scenario_name)
