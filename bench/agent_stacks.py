"""What one round of the agent's stacks costs its sampling: the longest the agent's sample loop
could not run (it waited for the interpreter) while the agent read the stacks of 8 ranks that are
importing torch, as a ratio of the sample interval (1 s). A ratio near 1 means a missed sample;
5 in a row and the watcher calls the node lost.

Real processes (8 Pythons importing torch, then sleeping), the real agent and py-spy, in this
process; a thread standing for the sample loop wakes every 10 ms and records its longest wait.
Run: .venv/bin/python bench/agent_stacks.py [--rounds N]"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ddp_preflight.node import agent as agent_module  # noqa: E402
from ddp_preflight.node import loops  # noqa: E402

RANKS = 8
IMPORT = "import torch, torch.distributed, torch.nn.parallel, time; time.sleep(60)"


def one_round(started_after: float) -> tuple[float, float]:
    """(seconds the round took, the longest the ticker waited) for 8 ranks read `started_after` s
    into their start."""
    loops._cache.clear()
    ranks = [subprocess.Popen([sys.executable, "-c", IMPORT], stderr=subprocess.DEVNULL) for _ in range(RANKS)]
    try:
        time.sleep(started_after)
        a = agent_module.Agent({"program": "agent", "node": "here", "pids": [p.pid for p in ranks],
                                "interval": 1.0, "stack_every": 3600.0})
        a.emit = lambda m: None
        a.ranks.scan()
        worst, done = [0.0], threading.Event()

        def tick():
            last = time.perf_counter()
            while not done.is_set():
                time.sleep(0.01)
                now = time.perf_counter()
                worst[0] = max(worst[0], now - last - 0.01)
                last = now
        ticker = threading.Thread(target=tick)
        ticker.start()
        began = time.perf_counter()
        a.stacks(None, None, None)
        took = time.perf_counter() - began
        done.set()
        ticker.join()
        return took, worst[0]
    finally:
        for p in ranks:
            p.kill()
            p.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    waits = []
    for i in range(args.rounds):
        took, worst = one_round(1.0 + 0.5 * (i % 3))
        waits.append(worst)
        print(f"round {i + 1}: stacks of {RANKS} ranks importing torch took {took:.2f} s; "
              f"the sample loop waited at most {worst:.2f} s")
    print(f"longest wait of the sample loop / its interval: {max(waits) / 1.0:.2f}x "
          f"(median {sorted(waits)[len(waits) // 2]:.2f}x) over {args.rounds} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
