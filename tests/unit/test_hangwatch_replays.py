"""The shapes that hangwatch told wrong or not at all (issue 16), replayed: what real agents sent
during lab runs of examples/hang_train.py (2 nodes x 2 ranks, torchrun's output a pipe: nothing
but the nodes' own evidence), recorded by tests/unit/artifacts/agent/record.py, through the real
Watcher on a driven clock. Each asserts the exact verdict."""

from __future__ import annotations

from ddp_preflight.hangwatch import stall
from ddp_preflight.hangwatch.text import summary

from .test_hangwatch_watch import replay


def _verdict(name, tmp_path, **options):
    header, watcher, events = replay(name, tmp_path, **options)
    said = [e for e in events if e.kind == "diagnosis"]
    assert len(said) == 1, [e.text for e in events]
    d = said[0].snapshot.diagnosis
    return header, d, said[0].data["at"] - header["fault_at"]


def test_an_uncaught_exception_is_the_rank_that_closed_its_connections_first(tmp_path):
    # Rank 1 raised RuntimeError: exit code 1, as a lost peer gives too; torchrun stopped rank 0
    # beside it while it was tearing down. The kernel's TIME_WAIT says rank 1 closed first with
    # every other rank: its code 1 is then its own failure.
    header, d, after = _verdict("raise", tmp_path)
    assert (d.kind, d.culprits, d.candidates, d.reason, d.certainty) == \
        ("exited", [header["rank"]], [], "failed", "certain") and header["rank"] == 1
    assert summary(d).startswith("rank 1 on master failed first (exit code 1): it closed its connections with ranks "
                                "0,2,3 before they closed theirs (the kernel's TIME_WAIT on its side); then rank 0 "
                                "(stopped by its launcher, +0.14 s)"), summary(d)


def test_a_rank_stopped_by_sigstop_is_named_from_the_kernels_state(tmp_path):
    header, d, after = _verdict("stop", tmp_path)
    assert (d.kind, d.culprits, d.candidates, d.reason, d.certainty) == \
        ("deadlock", [header["rank"]], [], "stopped", "certain") and header["rank"] == 1
    assert summary(d) == ("rank 1 is stopped (SIGSTOP or a debugger: the kernel's state T) at hang_train.py:192 (main); "
                         "ranks 0,2,3 wait in all_reduce")
    assert after <= stall.DEFAULT_THRESHOLD + 2


def test_a_hung_dataloader_worker_is_its_rank_waiting_for_data_at_its_own_line(tmp_path):
    # Held (likely), no hang: a worker that sleeps or reads a slow file looks the same from here as
    # one that never returns (issue 35: a data-loader pause was said as a certain deadlock; this
    # expectation was that defect). Past the held bound it is the hang, certain.
    header, watcher, events = replay("loader", tmp_path)
    said = [e for e in events if e.verdict is not None]
    assert [e.kind for e in said] == ["notice"], [e.text for e in events]
    d = said[0].verdict
    assert (d.kind, d.culprits, d.candidates, d.reason, d.certainty, d.bound) == \
        ("held", [header["rank"]], [], "waits-for-data", "likely", stall.HELD_BOUND) and header["rank"] == 1
    assert summary(d).startswith("rank 1 waits for its data: loading-data at hang_train.py:204 (main), and its "
                                 "DataLoader workers do nothing; ranks 0,2,3 wait in all_reduce; likely a stall ("), \
        summary(d)
    assert said[0].data["at"] - header["fault_at"] <= stall.DEFAULT_THRESHOLD + 2
    header, d, after = _verdict("loader", tmp_path / "bound", held_after=12.0)   # the recording ends 15 s in
    assert (d.kind, d.culprits, d.reason, d.certainty) == ("deadlock", [1], "waits-for-data", "certain")


def test_a_cycle_of_receives_names_no_rank_and_is_no_network_stall(tmp_path):
    header, d, after = _verdict("recv", tmp_path)
    assert (d.kind, d.culprits, d.candidates, d.reason, d.certainty) == \
        ("deadlock", [], [0, 1, 2, 3], "wait-for-each-other", "unsure")
    assert all(e.unsent == 0 and e.moved == 0 for e in d.evidence), d.evidence
    assert after <= stall.DEFAULT_THRESHOLD + 2
