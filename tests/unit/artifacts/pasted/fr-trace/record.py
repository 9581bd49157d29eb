"""Records torch's own Flight Recorder analyzer (python -m torch.distributed.flight_recorder.fr_trace, the
`torchfrtrace` command) on the lab's real Gloo dumps: tests/unit/artifacts/explain/launch-leave/flight-rank-
{0..3}.json (rank 2 left the loop at step 6 and never entered all_reduce #12, which ranks 0,1,3 issued).
No public thread pastes this analyzer's output (searched: "flight recorder", "fr_trace", "collective_seq_id",
"Not all ranks joining collective"), so the words are torch 2.13's, printed here:

- missing-rank.txt: the four dumps as they are, but for their pg_config: ddp-preflight's Gloo fetch keeps
  {'': {'desc': '', ...}}, and the analyzer keys groups by name, so it is given the default group's
  {'0': {'name': '0', 'desc': 'default_pg', 'ranks': '[0, 1, 2, 3]'}} (DERIVED: that field only);
- size-mismatch.txt, type-mismatch.txt: DERIVED: rank 2's dump gets one more entry, #12 all_reduce with
  another size ([[1024]]) / another op (gloo:broadcast): the analyzer's "has errors" report;
- missing-dump.txt: rank 2's dump left out: the analyzer's own AssertionError.

Run from the repository root with torch installed: python tests/unit/artifacts/pasted/fr-trace/record.py"""

from __future__ import annotations

import copy
import json
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
DUMPS = HERE.parents[1] / "explain" / "launch-leave"


def dumps(change: str | None, leave_out: int | None) -> str:
    with tempfile.TemporaryDirectory() as folder:
        for rank in range(4):
            if rank == leave_out:
                continue
            flight = json.loads((DUMPS / f"flight-rank-{rank}.json").read_text())["flight"]
            flight["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}}
            for entry in flight["entries"]:
                entry["process_group"] = tuple(entry["process_group"])
            if rank == 2 and change is not None:
                entry = copy.deepcopy(flight["entries"][-1])
                entry.update(collective_seq_id=entry["collective_seq_id"] + 1, op_id=entry["op_id"] + 1,
                             record_id=entry["record_id"] + 1)
                if change == "size":
                    entry.update(input_sizes=[[1024]], output_sizes=[[1024]])
                else:
                    entry["profiling_name"] = "gloo:broadcast"
                flight["entries"].append(entry)
            Path(folder, f"trace_{rank}").write_bytes(pickle.dumps(flight))
        done = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", "--prefix",
                               "trace_", folder], capture_output=True, text=True, cwd=folder)
        # torch's own warnings about numpy and tabulate are not the analyzer's report
        return "".join(line for line in (done.stdout + done.stderr).splitlines(keepends=True)
                       if "NumPy" not in line and "conversion_method" not in line and "tabulate is not" not in line)


if __name__ == "__main__":
    for name, change, leave_out in (("missing-rank", None, None), ("size-mismatch", "size", None),
                                    ("type-mismatch", "op", None), ("missing-dump", None, 2)):
        (HERE / f"{name}.txt").write_text(dumps(change, leave_out))
