"""Record what the nodes' agents really send during a lab run, for the watcher's replay tests.

    python tests/unit/artifacts/agent/record.py LAB FAULT RANK [SECONDS [SCRIPT_ARG ...]]

Starts examples/hang_train.py on the lab's 2 nodes x 2 ranks with `--fault FAULT --rank RANK`,
watches it with a real Watcher (threshold 8 s), and writes every agent message with the time
it arrived (seconds since the watch began) to FAULT.jsonl beside this file (or RECORD_AS.jsonl,
with RECORD_AS=NAME in the environment); the fault's own time
is kept too. SCRIPT_ARGs go to hang_train.py as they are (`--flight`: the ranks answer with their
Flight Recorder). With FREEZE_AFTER=S in the environment, S seconds after the fault every rank is
frozen with SIGSTOP, as ddp-preflight's stop does first (node/launch_runner.py's prepare-stop), and
the watcher is told so (launcher_stopping, as a launch tells it), master's ranks first, worker1's
FREEZE_GAP seconds later (the launch asks node by node, and waits up to 8 s for them all): the
header keeps when
("frozen_at", seconds since the watch began, and "frozen_wall", this machine's clock). Large
environments are cut to the variables the tests read."""

import json
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).parents[4]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "lab")]

from hangjob import cmdline_of, start_job  # noqa: E402

from ddp_preflight.cli.hangwatch import _connect  # noqa: E402
from ddp_preflight.hangwatch.watch import Watcher  # noqa: E402
from ddp_preflight.lab import Lab  # noqa: E402

KEEP = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME", "API_TOKEN"}


class Recording(Watcher):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.began, self.records = time.monotonic(), []

    def receive(self, node, msg):
        if msg.get("type") == "rank":
            msg = {**msg, "env": {k: v for k, v in msg["env"].items() if k in KEEP}}
        self.records.append({"at": round(time.monotonic() - self.began, 3), "node": node, "msg": msg})
        super().receive(node, msg)


def main():
    lab_name, fault, rank = sys.argv[1:4]
    seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 25
    lab = Lab.open(lab_name)
    targets, nodes, _ = _connect(["master", "worker1"], str(lab.ssh_config), sys.executable)
    watcher = Recording(targets, incident_dir="/tmp/hangwatch-record").start()
    job = start_job(lab, "--steps", "2000", "--fault", fault, "--rank", rank, "--at", "5", "--seconds", "20",
                    *sys.argv[5:], port=29690)
    frozen = {}
    try:
        fault_at = job.fault_time() - time.time() + time.monotonic() - watcher.began
        freeze = os.environ.get("FREEZE_AFTER")
        if freeze:
            time.sleep(max(0.0, fault_at + float(freeze) - (time.monotonic() - watcher.began)))
            frozen = {"frozen_at": round(time.monotonic() - watcher.began, 3), "frozen_wall": time.time()}
            for i, node in enumerate(("master", "worker1")):
                if i:
                    time.sleep(float(os.environ.get("FREEZE_GAP") or 0))    # node by node, as a stop goes
                for pid in lab.processes(node):
                    argv = cmdline_of(pid).split("\0")
                    if any(a.endswith("hang_train.py") for a in argv) and "torch.distributed.run" not in argv:
                        os.kill(pid, signal.SIGSTOP)
            watcher.launcher_stopping(None, frozen["frozen_wall"], "ddp-preflight")
        time.sleep(seconds)
    finally:
        job.stop()
        watcher.close()
        for node in nodes:
            node.close()
    out = Path(__file__).parent / f"{os.environ.get('RECORD_AS') or fault}.jsonl"
    with out.open("w") as f:
        f.write(json.dumps({"fault": fault, "rank": int(rank), "fault_at": round(fault_at, 3), **frozen}) + "\n")
        for record in watcher.records:
            f.write(json.dumps(record) + "\n")
    print(f"{out}: {len(watcher.records)} messages; diagnosis: {watcher.state.diagnosis}")


if __name__ == "__main__":
    main()
