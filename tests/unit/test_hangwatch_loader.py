"""A DataLoader's worker, as the one judge reads it (issue 35). A worker that blocks or sleeps
leaves its rank waiting for data, which may end by itself: held, likely, until the held bound
(test_hangwatch_replays: loader.jsonl). A worker that is gone is excluded from that reading: torch
itself raises in the rank, so the rank ended with an error of its own, certain.

artifacts/loader/*.txt: what a real DataLoader(num_workers=1) printed when its worker was SIGKILLed
(killed_worker.py, torch 2.13 CPU, this box): before it had sent a batch, torch's own check of
its workers ("DataLoader worker (pid(s) N) exited unexpectedly"); while it sent one through a
shared file descriptor, the reset of that connection in the rank's own loop (not a peer's: no
torch.distributed frame)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_preflight.hangwatch import exits, named
from ddp_preflight.hangwatch.ended import as_seen
from ddp_preflight.hangwatch.model import Evidence, Kind, RankStatus, Reason
from ddp_preflight.hangwatch.tracebacks import exception_in
from ddp_preflight.node.protocol import ExitStatus

LOADER = Path(__file__).parent / "artifacts" / "loader"


@pytest.mark.parametrize("name, said", [
    ("worker-killed-before-a-batch", ("RuntimeError", "DataLoader worker (pid(s) 27304) exited unexpectedly")),
    ("worker-killed-sending-a-batch", ("ConnectionResetError", "[Errno 104] Connection reset by peer")),
])
def test_a_rank_whose_loader_worker_was_killed_ended_by_its_own_error_certain(name, said):
    info = exception_in((LOADER / f"{name}.txt").read_text().splitlines())
    assert info is not None and (info.type, info.message) == said and not info.lost_peer
    own = exits.Ending("worker1", 4242, 2, status=ExitStatus(code=1), exception=as_seen(info, "output"), at=10.0)
    waiting = [Evidence("master", 4240 + r, r, RankStatus.COLLECTIVE, op="all_reduce") for r in (0, 1, 3)]
    d = named.judge([own], running=waiting)
    assert d is not None
    assert (d.kind, tuple(d.culprits), d.reason, d.certainty) == (Kind.EXITED, (2,), Reason.RAISED, "certain")
