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

from rules.launch_args import too_many_ranks

from .ports import free_port

ROOT = Path(__file__).resolve().parents[2]
HOST = socket.gethostname()


def command(*args: str) -> list[str]:
    return [sys.executable, "-P", "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
            "from cli.ddp_preflight import main; sys.exit(main())", *args]


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
    assert (f"ddp-preflight: not launching: --nproc-per-node 100000 is more ranks than {HOST} can run at once "
            f"({cpus} CPUs it may use, one rank each): give --nproc-per-node {cpus} or fewer; --force does not "
            "override this") in done.stderr.splitlines(), done.stderr[-3000:]
    assert os.listdir(markers) == []


def test_as_many_ranks_as_cpus_still_launch(tmp_path):
    cpus = usable_cpus()
    done, markers = launch(tmp_path, cpus)

    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(os.listdir(markers)) == sorted(f"rank-{r}" for r in range(cpus))


def test_the_bound_names_the_node_with_the_fewest_cpus_and_skips_unknown_ones():
    assert too_many_ranks(4, {"a": 8, "b": 2, "c": None, "d": 3}) == (
        "--nproc-per-node 4 is more ranks than b can run at once (2 CPUs it may use, one rank each): give "
        "--nproc-per-node 2 or fewer; --force does not override this")
    assert too_many_ranks(2, {"a": 8, "b": 2, "c": None}) is None
    assert too_many_ranks(100000, {"a": None}) is None
