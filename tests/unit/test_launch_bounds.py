"""Issue 34, part A: `--nproc-per-node` beyond what a node can run is refused, even with
--force (100,000 workers were started on a 2-core box). Judged from the node's facts (the CPUs
its affinity allows). The real command on this machine; the training script leaves a marker if
it ever starts."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from ddp_preflight.rules.launch_args import too_many_ranks

from .ports import free_port

ROOT = Path(__file__).resolve().parents[2]
HOST = socket.gethostname()


def command(*args: str) -> list[str]:
    return [sys.executable, "-P", "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
            "from ddp_preflight.cli.ddp_preflight import main; sys.exit(main())", *args]


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0))


def launch(tmp_path: Path, nproc: int) -> tuple[subprocess.CompletedProcess, Path]:
    code = tmp_path / "code"
    code.mkdir()
    markers = tmp_path / "markers"
    markers.mkdir()
    (code / "train.py").write_text(f"import os\nopen({str(markers)!r} + '/rank-' + os.environ['RANK'], 'w').close()\n")
    done = subprocess.run(command("--no-probes", "--force", "--device", "cpu", "--master-port", str(free_port()),
                                  "--nproc-per-node", str(nproc), "--launch", "--log-dir", str(tmp_path / "logs"),
                                  "--", "train.py"),
                          cwd=code, capture_output=True, text=True, timeout=300)
    return done, markers


def test_more_ranks_than_cpus_is_refused_even_with_force_and_nothing_starts(tmp_path):
    cpus = usable_cpus()
    done, markers = launch(tmp_path, 100000)

    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert (f"ddp-preflight: not launching: --nproc-per-node 100000 is more ranks than {HOST} can hold ({cpus} CPUs "
            f"it may use, at most 16 ranks each): give --nproc-per-node {16 * cpus} or fewer (ranks-per-node says "
            "how many run well); --force does not override this") in done.stderr.splitlines(), done.stderr[-3000:]
    assert os.listdir(markers) == []


def test_the_bound_is_one_past_what_a_node_can_hold(tmp_path):
    cpus = usable_cpus()
    done, markers = launch(tmp_path, 16 * cpus + 1)

    assert done.returncode == 1 and "--force does not override this" in done.stderr, done.stderr[-3000:]
    assert os.listdir(markers) == []


def test_more_ranks_than_cpus_but_within_the_bound_still_launch_with_force(tmp_path):
    cpus = usable_cpus()
    done, markers = launch(tmp_path, 2 * cpus)      # ranks-per-node fails; --force launches it

    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(os.listdir(markers)) == sorted(f"rank-{r}" for r in range(2 * cpus))


def test_the_bound_names_the_node_with_the_fewest_cpus_and_skips_unknown_ones():
    assert too_many_ranks(60, {"a": 8, "b": 2, "c": None, "d": 3}) == (
        "--nproc-per-node 60 is more ranks than b can hold (2 CPUs it may use, at most 16 ranks each): give "
        "--nproc-per-node 32 or fewer (ranks-per-node says how many run well); --force does not override this")
    assert too_many_ranks(32, {"a": 8, "b": 2, "c": None}) is None
    assert too_many_ranks(100000, {"a": None}) is None
