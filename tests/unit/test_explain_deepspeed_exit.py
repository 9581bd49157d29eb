"""DeepSpeed's launcher logs `{cmd} exits with return code = N` with the command it spawned last (its
sigkill_handler reads the spawn loop's `cmd`), whichever process failed: the command's --local_rank
names the failed process only where the launcher stopped one process ("Killing subprocess" once).
The lines are DeepSpeed's own format (tests/unit/artifacts/pasted/129, 130, 144)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_preflight.explain import explain

KILLING = "[2023-04-14 13:11:27,879] [INFO] [launch.py:428:sigkill_handler] Killing subprocess {pid}\n"
EXITS = ("[2023-04-14 13:11:27,885] [ERROR] [launch.py:434:sigkill_handler] ['/usr/bin/python3', '-u', 'main.py', "
         "'--local_rank={local}', '--zero_stage', '2'] exits with return code = -9\n")


@pytest.mark.parametrize("processes,culprits", [(1, (0,)), (2, ()), (8, ())])
def test_the_local_rank_deepspeed_prints_is_the_failed_ones_only_with_one_process(tmp_path: Path, processes, culprits):
    log = tmp_path / "ds.log"
    log.write_text("".join(KILLING.format(pid=13266 + i) for i in range(processes))
                   + EXITS.format(local=processes - 1 if processes > 1 else 0))
    f = explain([str(log)]).finding
    assert f is not None
    assert (f.kind.value, f.cause.value, f.culprits) == ("signal-killed", "sigkill-oom-or-scheduler", culprits)
