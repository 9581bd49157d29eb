"""Flight Recorder dumps pasted as text (issue 37): the lab's real Gloo dumps of a rank that left the loop
(tests/unit/artifacts/explain/launch-leave/flight-rank-N.json: rank 2 never entered all_reduce #12) as
people paste them (the files' JSON one after the other; pprint of each pickle's entries, as torch's docs
print them; under srun's labels) give the verdict the dump files give; entries whose rank nothing says are
not read, and the H100's real one-rank dump (tests/unit/artifacts/gpu-h100/fr-dump.txt) names no one."""

from __future__ import annotations

import json
import pprint
from pathlib import Path

import pytest

from ddp_preflight.explain import explain

ARTIFACTS = Path(__file__).parent / "artifacts"
LEAVE = ARTIFACTS / "explain" / "launch-leave"
BEHIND = ("deadlock", (2,), "certain")


def _dumps() -> list[dict]:
    return [json.loads((LEAVE / f"flight-rank-{r}.json").read_text()) for r in range(4)]


def said(tmp_path: Path, text: str) -> tuple | None:
    path = tmp_path / "paste.txt"
    path.write_text(text)
    d = explain([str(path)]).diagnosis
    return None if d is None else (d.kind.value, d.culprits, d.certainty.value)


def _printed(flight: dict, width: int = 80) -> str:
    return "\n".join(pprint.pformat({k: v for k, v in e.items() if k != "frames"}, width=width)
                     for e in flight["entries"][-4:])


def test_the_dump_files_json_pasted_one_after_the_other_is_the_folders_verdict(tmp_path):
    text = "".join(f"$ cat flight-rank-{d['rank']}.json\n{json.dumps(d, indent=2)}\n" for d in _dumps())
    assert said(tmp_path, text) == BEHIND
    assert said(tmp_path, text) == (lambda d: (d.kind.value, d.culprits, d.certainty.value))(
        explain([str(LEAVE / f"flight-rank-{r}.json") for r in range(4)]).diagnosis)


@pytest.mark.parametrize("width", [80, 400])      # pprint's entry a key a line, or one line each
def test_pprint_of_each_ranks_entries_under_its_dump_name(tmp_path, width):
    text = "".join(f"/tmp/nccl_trace_rank_{d['rank']} <class 'dict'> {list(d['flight'])}\n"
                   f"entries: {len(d['flight']['entries'])}\n{_printed(d['flight'], width)}\n" for d in _dumps())
    assert said(tmp_path, text) == BEHIND


def test_pprint_under_srun_labels_takes_each_ranks_label(tmp_path):
    text = "".join("".join(f"{d['rank']}: {line}\n" for line in _printed(d["flight"]).splitlines()) for d in _dumps())
    assert said(tmp_path, text) == BEHIND


def test_entries_whose_rank_nothing_says_are_not_read(tmp_path):
    text = "\n".join(_printed(d["flight"]) for d in _dumps()) + "\n"
    assert said(tmp_path, text) is None


def test_the_h100s_one_rank_dump_names_no_one():
    d = explain([str(ARTIFACTS / "gpu-h100" / "fr-dump.txt")]).diagnosis
    assert d is None or not d.culprits
