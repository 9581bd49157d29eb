"""Recorded snapshots as a Source: show a run saved with `hangwatch attach --json` again, and
drive the dashboard in tests and benches without a cluster.

    python -m ddp_preflight.tui.replay deadlock.json [events.jsonl ...]
"""

from __future__ import annotations

import copy
import json
import sys
import threading
from dataclasses import replace
from pathlib import Path

from ddp_preflight.hangwatch.model import NodeStatus, NodeView, Snapshot
from ddp_preflight.hangwatch.source import Source
from ddp_preflight.node.terminal import shown


class ReplaySource(Source):
    """Serves the snapshots in order, one per call, then keeps serving the last. A replay
    cannot act on a run; it keeps what it was asked (`asked`) so tests and benches can see it."""

    def __init__(self, snapshots: list[Snapshot], launched: bool = False,
                 logs: dict[tuple[str, int | None], list[str]] | None = None):
        if not snapshots:
            raise ValueError("a replay needs at least one snapshot")
        self.snapshots = list(snapshots)
        self.launched = launched
        self.logs = logs or {}
        self.asked: list[str] = []
        self._next = 0
        self._lock = threading.Lock()      # the dashboard calls from worker threads

    @classmethod
    def from_files(cls, *paths: str | Path, launched: bool = False) -> ReplaySource:
        """Each file holds a snapshot, a list of them, or the JSON lines `hangwatch attach
        --json` prints (the events that carry a snapshot are replayed)."""
        snapshots = []
        for path in paths:
            text = Path(path).read_text()
            try:
                documents = [json.loads(text)]
            except json.JSONDecodeError:
                documents = [json.loads(line) for line in text.splitlines() if line.strip()]
            found = [Snapshot.from_json(s) for s in _snapshots_in(documents)]
            if not found:
                raise ValueError(f"{path} holds no snapshot")
            snapshots += found
        return cls(snapshots, launched=launched)

    def snapshot(self) -> Snapshot:
        with self._lock:
            snap = self.snapshots[min(self._next, len(self.snapshots) - 1)]
            self._next += 1
            return snap

    def dump_stacks(self) -> None:
        self.asked.append("dump_stacks")

    def write_bundle(self) -> str | None:
        self.asked.append("write_bundle")
        return None

    def log(self, node: str, rank: int | None = None, lines: int = 200) -> list[str]:
        self.asked.append(f"log {node} {rank}")
        if (node, rank) in self.logs:
            return self.logs[(node, rank)][-lines:]
        # Without a recorded log the last output line is all a snapshot keeps.
        last = self.snapshots[max(0, min(self._next, len(self.snapshots)) - 1)]
        return [r.last_line for r in last.ranks if r.node == node and r.rank == rank and r.last_line]

    def stop(self) -> None:
        self.asked.append("stop")


def _snapshots_in(documents: list) -> list[dict]:
    found = []
    for document in documents:
        for item in document if isinstance(document, list) else [document]:
            if isinstance(item, dict) and isinstance(item.get("snapshot"), dict):
                found.append(item["snapshot"])          # an event line of `hangwatch attach --json`
            elif isinstance(item, dict) and "ranks" in item and "threshold" in item:
                found.append(item)
    return found


def widen(snapshot: Snapshot, nodes: int, ranks_per_node: int) -> Snapshot:
    """The recorded run as if on `nodes` x `ranks_per_node` ranks: each new rank copies the
    recorded rank in its position (so a deadlock's guilty rank keeps a guilty copy), renumbered."""
    template = sorted(snapshot.ranks, key=lambda r: r.rank if r.rank is not None else r.pid)
    if not template:
        raise ValueError("a snapshot without ranks cannot be widened")
    wide = copy.deepcopy(snapshot)
    names = [snapshot.nodes[0].name if snapshot.nodes else "master"] + [f"worker{i}" for i in range(1, nodes)]
    proto = snapshot.nodes[0] if snapshot.nodes else NodeView(names[0], NodeStatus.WATCHING)
    wide.nodes = [NodeView(name, proto.status, proto.message, proto.interface, ranks_per_node,
                           proto.net_bytes_per_s) for name in names]
    wide.ranks = []
    world = nodes * ranks_per_node
    for rank in range(world):
        r = copy.deepcopy(template[rank % len(template)])
        r.node, r.rank, r.local_rank = names[rank // ranks_per_node], rank, rank % ranks_per_node
        r.world_size, r.pid = world, 20000 + rank
        wide.ranks.append(r)
    if wide.diagnosis:
        def widened(ranks) -> list[int]:
            keep = {r.rank for r in template if r.rank in ranks}
            return [r for r in range(world) if template[r % len(template)].rank in keep]
        # Each rank's evidence copies its template's too: the verdict's words are rendered from it.
        seen = {e.rank: e for e in wide.diagnosis.evidence}
        evidence = [replace(seen[t.rank], node=r.node, pid=r.pid, rank=r.rank)
                    for r, t in ((r, template[r.rank % len(template)]) for r in wide.ranks if r.rank is not None)
                    if t.rank in seen]
        wide.diagnosis = replace(wide.diagnosis, culprits=widened(wide.diagnosis.culprits),
                                 candidates=widened(wide.diagnosis.candidates), evidence=evidence)
    if wide.run:
        wide.run.update(nnodes=nodes, nproc_per_node=ranks_per_node,
                        ranks_per_node={name: ranks_per_node for name in names})
    return wide


def main(argv: list[str]) -> int:
    from .app import run_dashboard  # the replay's data side stays importable without Textual

    if not argv:
        print("usage: python -m ddp_preflight.tui.replay SNAPSHOT.json [...]", file=sys.stderr)
        return 2
    try:
        source = ReplaySource.from_files(*argv)
    except (OSError, ValueError, KeyError, TypeError) as exc:      # JSONDecodeError is a ValueError
        print(shown(f"cannot replay {' '.join(argv)}: {exc}"), file=sys.stderr)     # it may quote the file
        return 2
    run_dashboard(source)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
