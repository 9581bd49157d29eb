"""A paste that shows some ranks of a run waiting past the timeout names none of them: the rank they
waited for is one the paste does not show. explain says which ranks are missing (of the world a line
states, or below the highest rank shown) and whose log to paste next; a paste that may be the
whole run (rank 0 alone, no world stated) is read as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_preflight.explain import explain

PASTED = Path(__file__).parent / "artifacts" / "pasted"
LOGS = Path(__file__).parent / "artifacts" / "logs"


@pytest.mark.parametrize("name,shown,missing,world", [
    # rank 1's watchdog status alone (accelerate, ZeRO-3): before, network-stall (likely) culprits [1]
    ("095-accelerate-zero3-save-timeout-at-work.log", [1], [0], None),
    # ranks 13,14 of NCCL's "nranks 16": before, culprits [13, 14]
    ("096-transformers-save-ckpt-watchdog-nccl-info-mixed.log", [13, 14], [*range(13), 15], 16),
    # ranks 0,4 timed out, rank 3 said where its group was: before, culprits [0, 4]
    ("023-llamafactory-watchdog-line-numbers.log", [0, 3, 4], [1, 2], None),
])
def test_a_partial_paste_names_the_missing_ranks_never_a_rank_it_shows(name, shown, missing, world):
    e = explain([str(PASTED / name)])
    d = e.diagnosis
    assert d is not None
    assert (d.kind.value, list(d.culprits), d.certainty.value) == ("unseen", [], "unsure")
    assert list(d.candidates) == (missing if world else [])
    assert sorted(x.key for x in d.evidence if "not in the paste" in x.notes) == missing
    assert d.unknown_why.startswith(f"the paste shows {'rank' if len(shown) == 1 else 'ranks'} "
                                    f"{','.join(map(str, shown))}" + (f" of a world of {world}" if world else ""))
    assert e.fix is not None and e.fix.text().startswith(f"paste rank {missing[0]}'s log too")
    assert not e.ok


def test_a_lone_rank_0_with_no_world_stated_may_be_the_whole_run():
    # one NCCL rank under torchrun --nproc_per_node 1, hung on its GPU (a recorded H100 run)
    d = explain([str(LOGS / "nccl-h100" / "hung-train-tail.log")]).diagnosis
    assert d is not None and (d.kind.value, list(d.culprits)) == ("network-stall", [0])
