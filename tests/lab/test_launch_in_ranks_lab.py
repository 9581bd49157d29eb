"""`ddp-preflight --launch` with its probes on the lab: the probes that need torch run inside the
training's own ranks (one torchrun and one torch import per rank), which wait at a gate until
preflight's report says READY (test_launch_lab's first test: the pids that waited trained);
NOT READY stops them there, before the script's first line."""

from __future__ import annotations

import re

from .test_launch_lab import assert_nothing_left, counts, launch, said

IN_RANKS = "ddp-preflight: stage probes in the training's ranks, until every rank waited"


def test_not_ready_stops_the_ranks_at_the_gate_before_the_scripts_first_line(clean_lab, tmp_path):
    script = tmp_path / "train.py"
    # Its first line leaves a file (the lab's nodes share this folder): the launcher holds the
    # ranks' output until its word, so only a trace outside it shows whether a line ran.
    ran = tmp_path / "ran"
    ran.mkdir()
    script.write_text(f'import os; open(os.path.join({str(ran)!r}, str(os.getpid())), "w").close()\n'
                      'print("the first line of the script", flush=True)\nimport s47_not_installed_anywhere\n')
    before = counts(clean_lab)
    done = launch(clean_lab, tmp_path, "-v", script=script)
    assert done.returncode == 1, said(done)
    assert IN_RANKS in done.stderr, said(done)       # the ranks ran the probes and waited
    for check in ("collectives", "bandwidth", "compute-balance"):      # their figures, read from the ranks' lines
        assert re.search(rf"^│{check}\s+│[^│]*│ pass ", done.stdout, re.MULTILINE), done.stdout[-3000:]
    assert "ddp-preflight: not launching: training-imports on master failed" in done.stderr, said(done)
    assert "the first line of the script" not in done.stdout + done.stderr and list(ran.iterdir()) == []
    assert not (tmp_path / "run").exists()           # as any refusal: no log folder left
    assert_nothing_left(clean_lab, before)

