"""A launched run as the dashboard sees it: hangwatch's view of the ranks, with what the
launcher knows besides (each rank's last line, its step and step rate, exit codes it saw from
torchrun), the preflight report, and a stop that ends the training it started.

The launcher is duck-typed (ddp_preflight.launch.run.Launch): `ranks`, `plan`, `tail()`, `stop()`."""

from __future__ import annotations

import time
from dataclasses import replace

from ddp_preflight.node.protocol import ExitStatus

from .model import RankView, Snapshot
from .source import Source

RATE_WINDOW = 30.0     # seconds of steps behind a step rate


class LaunchedRun(Source):
    launched = True

    def __init__(self, watcher, launch, preflight: dict | None = None):
        self.watcher, self.launch, self.preflight = watcher, launch, preflight
        self._steps: dict[int, list[tuple[float, int]]] = {}

    def run_info(self) -> dict:
        plan = self.launch.plan
        return {"backend": plan.backend,
                "master": f"{plan.master_addr}:{plan.master_port}", "nnodes": len(plan.nodes),
                "nproc_per_node": plan.uniform_nproc, "ranks_per_node": plan.ranks_per_node, "launched": True}

    def snapshot(self) -> Snapshot:
        snap = self.watcher.snapshot()
        now = time.time()
        ours = self._not_ours()
        ranks = [r for r in snap.ranks if not ours(r)]
        by_rank = {r.rank: r for r in ranks if r.rank is not None}
        for rank, state in sorted(self.launch.ranks.items()):
            view = by_rank.get(rank)
            if view is None:      # started, not yet seen by the node's agent
                if state.pid is None:
                    continue
                view = RankView(node=state.node, pid=state.pid, rank=rank, local_rank=state.local_rank,
                                world_size=self.launch.plan.world_size)
                ranks.append(view)
            view.last_line = state.last_line
            view.step = state.step
            view.step_rate = self._rate(rank, state.step, now)
            if state.exit is not None or state.signal is not None:
                view.state = "exited"
                view.exit = ExitStatus(code=state.exit) if state.exit is not None else ExitStatus(signal=state.signal)
        nodes = snap.nodes
        for node in nodes:
            plan_node = next((n for n in self.launch.plan.nodes if n.node == node.name), None)
            env = dict(getattr(plan_node, "env", {}) or {})
            node.interface = env.get("GLOO_SOCKET_IFNAME") or env.get("NCCL_SOCKET_IFNAME") or node.interface
        return replace(snap, ranks=sorted(ranks, key=lambda v: (v.rank is None, v.rank or 0)),
                       run=self.run_info(), preflight=self.preflight)

    def _not_ours(self):
        """Whether a process the node's agent took for a rank belongs to another job: on a node
        whose launched ranks' PIDs are all known, one that is none of them (another torchrun's
        "rank 0" beside this run's is not a row of this run)."""
        pids: dict[str, set[int]] = {}
        complete: set[str] = set()
        by_node: dict[str, list] = {}
        for state in self.launch.ranks.values():
            by_node.setdefault(state.node, []).append(state)
        for node, states in by_node.items():
            pids[node] = {s.pid for s in states if s.pid is not None}
            if all(s.pid is not None for s in states):
                complete.add(node)
        return lambda view: view.node in complete and view.pid not in pids[view.node]

    def _rate(self, rank: int, step: int | None, now: float) -> float | None:
        if step is None:
            return None
        seen = self._steps.setdefault(rank, [])
        if not seen or seen[-1][1] != step:
            seen.append((now, step))
        while len(seen) > 2 and now - seen[0][0] > RATE_WINDOW:
            seen.pop(0)
        if len(seen) < 2 or seen[-1][0] == seen[0][0]:
            return None
        return (seen[-1][1] - seen[0][1]) / (now - seen[0][0])

    def dump_stacks(self) -> None:
        self.watcher.dump_stacks()

    def write_bundle(self) -> str | None:
        return self.watcher.write_bundle()

    def log(self, node: str, rank: int | None = None, lines: int = 200) -> list[str]:
        return self.launch.tail(node, rank, lines)

    def stop(self) -> None:
        self.launch.stop("quit from the dashboard")
