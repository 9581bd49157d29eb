"""The recorded deadlock (artifacts/snapshots/deadlock.json) on 64 ranks, 8 nodes x 8, with one odd
rank: every rank copies the recorded waiting rank 0 (in all_reduce, its recorded py-spy stack) but
the odd one, which copies the recorded rank 1 that left the loop (idle at hang.py:11). The Flight
Recorder numbers are made up as a launched run shows them: the waiting ranks entered all_reduce
#12, the odd one's last was #11; all saw #11 complete."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

from ddp_preflight.hangwatch.model import NodeView, Snapshot

RECORDED = Path(__file__).parent / "artifacts" / "snapshots" / "deadlock.json"
NODES = ["master"] + [f"worker{i}" for i in range(1, 8)]


def deadlock_of_64(odd: int = 33) -> Snapshot:
    base = Snapshot.from_json(json.loads(RECORDED.read_text()))
    assert base.diagnosis is not None
    waiting, left = base.ranks[0], base.ranks[1]
    waiting_seen, left_seen = base.diagnosis.evidence[0], base.diagnosis.evidence[1]
    ranks, evidence = [], []
    for rank in range(64):
        view = copy.deepcopy(left if rank == odd else waiting)
        node, seq = NODES[rank // 8], 11 if rank == odd else 12
        view.node, view.rank, view.local_rank, view.world_size, view.pid = node, rank, rank % 8, 64, 20000 + rank
        view.flight = {"groups": [{"group": "default_pg", "seq": seq, "op": "all_reduce", "completed": 11}]}
        ranks.append(view)
        evidence.append(replace(left_seen if rank == odd else waiting_seen, node=node, pid=view.pid, rank=rank,
                                seq=seq, seq_op="all_reduce", completed=11))
    diagnosis = replace(base.diagnosis, culprits=[odd], evidence=evidence)
    wide = copy.deepcopy(base)
    wide.ranks, wide.diagnosis = ranks, diagnosis      # its words are rendered from these fields
    wide.nodes = [NodeView(name, base.nodes[0].status, None, "eth0", 8, 0.0) for name in NODES]
    assert wide.run is not None
    wide.run.update(nnodes=8, nproc_per_node=8)
    return wide
