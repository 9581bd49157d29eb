"""Derive the dashboard's snapshot fixtures from the recorded real artifacts (run from the repo
root: `python tests/unit/artifacts/snapshots/derive.py`). The README says what is recorded and
what is made up; the lead replaces these with snapshots recorded in the lab."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))

from ddp_preflight.hangwatch.classify import classify, frames_of  # noqa: E402
from ddp_preflight.hangwatch.diagnose import diagnose  # noqa: E402
from ddp_preflight.hangwatch.model import NodeView, RankView, Snapshot  # noqa: E402
from ddp_preflight.hangwatch.render import snapshot_json  # noqa: E402
from ddp_preflight.preflight.checks import FACT_CHECKS, run_checks  # noqa: E402
from ddp_preflight.preflight.model import Report  # noqa: E402
from tests.unit import facts_fixtures as ff  # noqa: E402

HERE = Path(__file__).parent
PYSPY = HERE.parent / "pyspy"
TIME = 1763720100.0          # 2025-11-21 10:15:00 UTC
NODES = ("master", "worker1")
RUN = {"backend": "gloo", "master": "10.213.0.200:29500", "nnodes": 2, "nproc_per_node": 2, "launched": True}


def preflight_report() -> dict:
    # The clean lab's recorded facts with two edits that warn: worker1 oversubscribes its cores
    # and its clock runs 5 s ahead.
    art = ff.clock(ff.env(ff.clean(), "worker1", OMP_NUM_THREADS="4"), "worker1", 5.0)
    results = run_checks(ff.context(art, launch_args=(), nproc_per_node=2), FACT_CHECKS)
    return Report(tuple(results), NODES).to_json()


def stack(dump: list[dict], user_only: bool = False) -> list[dict]:
    frames = frames_of(dump)
    if user_only:
        frames = [f for f in frames if not f.in_library]
    return [{"function": f.function, "file": f.file, "line": f.line} for f in frames]


def busy_history(rank: int, samples: int) -> list[float]:
    return [round(95.0 + ((i * 7 + rank * 3) % 9) * 0.5, 1) for i in range(samples)]


def healthy() -> Snapshot:
    computing = stack(json.loads((PYSPY / "deadlock_rank0_all_reduce.json").read_text()), user_only=True)
    ranks = []
    for rank in range(4):
        node = NODES[rank // 2]
        history = busy_history(rank, 60)
        step = 120 - rank % 2
        ranks.append(RankView(node=node, pid=11350 + rank, rank=rank, local_rank=rank % 2, world_size=4,
                              cpu=history[-1], history=history, state="computing",
                              frame="hang.py:6", function="train_step", wchan=None,
                              last_line=f"step {step} loss {2.3026 - step * 0.004:.4f}", step=step,
                              step_rate=4.2 - rank * 0.1,
                              # rank 3's stack has not been taken yet (stacks are taken rarely)
                              stack=computing if rank != 3 else None))
    nodes = [NodeView(name, "watching", None, "eth0", 2, 1.2e6) for name in NODES]
    return Snapshot(TIME, 8.0, RUN, nodes, ranks, None, [], [], preflight_report())


def deadlock() -> Snapshot:
    waiting = json.loads((PYSPY / "deadlock_rank0_all_reduce.json").read_text())
    left = json.loads((PYSPY / "deadlock_rank1_left_loop.json").read_text())
    dumps = {0: (waiting, "futex_do_wait"), 1: (left, "hrtimer_nanosleep"),
             2: (waiting, "futex_do_wait"), 3: (waiting, "futex_do_wait")}
    idle_for = 42.0
    states = {r: classify(d, 0.0, wchan) for r, (d, wchan) in dumps.items()}
    found = diagnose({r: s.as_evidence(NODES[r // 2], 11350 + r, r) for r, s in states.items()})
    ranks = []
    for rank, (dump, wchan) in dumps.items():
        state = states[rank]
        history = busy_history(rank, 60 - int(idle_for)) + [0.0] * int(idle_for)
        ranks.append(RankView(node=NODES[rank // 2], pid=11350 + rank, rank=rank, local_rank=rank % 2,
                              world_size=4, cpu=0.0, history=history, state=state.state, op=state.op,
                              frame=state.frame.where if state.frame else None,
                              function=state.frame.function if state.frame else None, wchan=wchan,
                              idle_for=idle_for, last_line="step 3 loss 2.2906" if rank == 1 else
                              "step 3 loss 2.2904", step=3, step_rate=0.0, stack=stack(dump)))
    diagnosis = found.as_reported(TIME - idle_for)
    nodes = [NodeView(name, "watching", None, "eth0", 2, 0.0) for name in NODES]
    return Snapshot(TIME, 8.0, RUN, nodes, ranks, diagnosis,
                    ["/var/tmp/hangwatch/incident-20251121-101500-deadlock"], [], preflight_report())


if __name__ == "__main__":
    for name, snap in (("healthy", healthy()), ("deadlock", deadlock())):
        (HERE / f"{name}.json").write_text(json.dumps(snapshot_json(snap), indent=1) + "\n")
        print(f"wrote {name}.json: {len(snap.ranks)} ranks, diagnosis {snap.diagnosis and snap.diagnosis.kind}")
