"""torchrun's `--tee` stream made whole again (launch/output.Tee), on a real torchrun: its tail
reads each rank's log file a line at a time and takes what is there at the file's end, so a rank
caught mid-line has the rest of that line come later under its prefix, with other ranks' parts
between (3 of 100,000 lines lost in one CI run of test_launch_safety_lab's full log folder)."""

from __future__ import annotations

import subprocess
import sys

from ddp_preflight.launch.output import Tee

# Each rank writes half a line, waits (torchrun's tail takes it), then the rest.
HALVES = """
import os, sys, time
rank = os.environ["RANK"]
for i in range(3):
    sys.stdout.write(f"line {rank} {i} first half, "); sys.stdout.flush(); time.sleep(1.0)
    sys.stdout.write("second half\\n"); sys.stdout.flush(); time.sleep(0.3)
sys.stdout.write(f"rank {rank} ends without a newline"); sys.stdout.flush()
"""


def test_lines_torchrun_tails_in_parts_come_out_whole_each_under_its_rank(tmp_path):
    script = tmp_path / "halves.py"
    script.write_text(HALVES)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "--tee", "3", str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    raw = done.stdout.splitlines()
    # torchrun's own stream: parts of lines, each under its prefix, ranks interleaved.
    assert any(line.count("[default") > 1 for line in raw), raw
    tee = Tee()
    whole = [out for line in raw for out in tee.feed(line)] + tee.rest()
    for rank in (0, 1):
        mine = [line for line in whole if line.startswith(f"[default{rank}]:")]
        assert mine == [f"[default{rank}]:line {rank} {i} first half, second half" for i in range(3)] + \
            [f"[default{rank}]:rank {rank} ends without a newline"], whole
    assert len(whole) == 8


def test_a_line_without_torchruns_prefix_passes_as_it_is():
    tee = Tee()
    assert tee.feed("torchrun's own [default0]: words") == ["torchrun's own [default0]: words"]
    assert tee.feed("[default0]:whole") == ["[default0]:whole"] and tee.rest() == []
