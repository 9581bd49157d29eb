"""`-v` prints preflight's own time per stage on stderr (issue 36): the facts, each probe, the
checks, and their total; the report itself is the same with or without it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STAGE = re.compile(r"^ddp-preflight: stage (.+) (\d+\.\d) s$")


def preflight(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddp_preflight", "--no-probes", "--only", "python-parity", *args],
                          capture_output=True, text=True, cwd=REPO, timeout=120)


def test_verbose_prints_each_stage_and_the_total():
    done = preflight("-v")
    stages = [m.groups() for line in done.stderr.splitlines() if (m := STAGE.match(line))]
    assert [name for name, _ in stages] == ["facts", "checks", "total"], done.stderr
    seconds = [float(s) for _, s in stages]
    assert abs(seconds[0] + seconds[1] - seconds[2]) <= 0.11
    assert seconds[0] > 0.0


def test_without_verbose_no_stage_line():
    done = preflight()
    assert not [line for line in done.stderr.splitlines() if STAGE.match(line)], done.stderr
