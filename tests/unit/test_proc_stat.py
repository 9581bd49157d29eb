"""/proc/PID/stat is read in one place (node/proc.py), for the agent, the rank finder, the
exit-code reader, the lab and the benchmarks: a command name that looks like more fields does
not shift anyone's fields."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from ddp_preflight.lab import system
from ddp_preflight.node import proc
from ddp_preflight.node.exitcodes import _ancestors

ROOT = Path(__file__).parents[2]
# A name that fools a parser that splits from the left or at the first ')': 15 bytes, the kernel's limit.
ODD_NAME = "a) Z 1 (b) R 7"


def test_a_process_whose_name_looks_like_fields_is_read_right():
    child = subprocess.Popen([sys.executable, "-c", f"open('/proc/self/comm', 'w').write({ODD_NAME!r}); "
                              "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while (proc.read(f"/proc/{child.pid}/comm") or "").strip() != ODD_NAME[:15]:
            assert time.monotonic() < deadline, "the child did not rename itself"
            time.sleep(0.01)
        found = proc.stat(child.pid)
        assert found is not None
        assert found.ppid == os.getpid() and found.state in ("S", "R")
        assert system.process_start_ticks(child.pid) == found.start_ticks
        assert system._exists(child.pid)
    finally:
        child.stdin.close()
        child.wait(30)
    assert proc.stat(child.pid) is None and not system._exists(child.pid)


def test_the_exit_code_readers_ancestors_are_this_process_parents():
    assert next(iter(_ancestors())) == os.getppid()


def test_no_other_module_parses_proc_pid_stat():
    # One parser: a module that opens /proc/PID/stat itself is a second rule for the same fields.
    opened = re.compile(r"""/proc/\{[^}]*\}/stat["']|/proc/%d/stat["']|"/stat"\)""")
    found = [str(path.relative_to(ROOT)) for package in ("ddp_preflight/node", "ddp_preflight/transport", "ddp_preflight/rules", "ddp_preflight/preflight", "ddp_preflight/hangwatch",  # noqa: E501
                                                        "ddp_preflight/launch", "ddp_preflight/explain", "ddp_preflight/lab", "ddp_preflight/tui", "ddp_preflight/cli", "bench")  # noqa: E501
             for path in sorted((ROOT / package).rglob("*.py")) if opened.search(path.read_text())]
    assert found == ["ddp_preflight/node/proc.py"], found
