"""Every node's output, as lines that say which node and which rank wrote them, and one log
file per node on the master.

torchrun's `--tee 3` prefixes each rank's lines with its role and local rank ("[default0]:");
the global rank is node_rank x nproc_per_node + local_rank (static rendezvous). Lines without
a prefix are torchrun's own (or the node's), and belong to the node."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from pathlib import Path

TEE_PREFIX = re.compile(r"^\[([A-Za-z_]\D*?)(\d+)\]:(.*)$")
STEP = re.compile(r"^\s*step\b\s*[:=#]?\s*(\d+)", re.IGNORECASE)     # nanochat: "step 00004/05000 ..."


@dataclass(frozen=True)
class Line:
    node: str
    rank: int | None           # global rank; None for torchrun's (or the node's) own lines
    local_rank: int | None
    text: str
    time: float                # when it reached the master, epoch seconds

    def prefixed(self) -> str:
        who = f"{self.node} r{self.rank}" if self.rank is not None else self.node
        return f"[{who}] {self.text}"

    @property
    def step(self) -> int | None:
        """N of a "step N ..." line: training progress, for the first-step time and the dashboard."""
        if self.rank is None:
            return None
        found = STEP.match(self.text)
        return int(found.group(1)) if found else None


def parse(node: str, node_rank: int, nproc_per_node: int, raw: str, now: float) -> Line:
    found = TEE_PREFIX.match(raw)
    if found:
        local = int(found.group(2))
        return Line(node, node_rank * nproc_per_node + local, local, found.group(3), now)
    return Line(node, None, None, raw, now)


def safe_name(node: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.@-]", "_", node) or "node"


class NodeLogs:
    """`<folder>/<node>.log`: every line of that node, prefixed as on the terminal."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._files: dict[str, object] = {}
        self._lock = threading.Lock()

    def path(self, node: str) -> Path:
        return self.folder / f"{safe_name(node)}.log"

    def write(self, node: str, text: str) -> None:
        with self._lock:
            f = self._files.get(node)
            if f is None:
                f = self._files[node] = open(self.path(node), "a", buffering=1, encoding="utf-8")
            f.write(text + "\n")

    def close(self) -> None:
        with self._lock:
            for f in self._files.values():
                f.close()
            self._files.clear()
