"""Verdicts that must survive what a hang causes (issue 27), under `ddp-preflight --launch` on the
lab: a real 2-node x 2-rank Gloo run of examples/hang_train.py. A subgroup's collective skipped by
one of its members is that member's, named for that group; once a hang is named, the victims'
timeouts, torchrun's stop of the others and ddp-preflight's own freeze and stop are its
consequence: one verdict, one bundle, the same in the summary and result.json."""

from __future__ import annotations

import json
import re
import subprocess

from .test_launch_lab import REPO, assert_nothing_left, command, counts

HANG = REPO / "examples" / "hang_train.py"
VERDICT = re.compile(r"^ddp-preflight: hangwatch: ([A-Z-]+): ")


def launched(lab, tmp_path, *options, script_args, timeout=240) -> subprocess.CompletedProcess:
    argv = command(lab, tmp_path, "--no-probes", *options)
    argv = argv[:argv.index("--") + 1] + [str(HANG), *script_args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    # ddp-preflight's own crash (a rank's traceback comes with its [node rN] prefix)
    assert not any(line.startswith("Traceback") for line in done.stderr.splitlines()), done.stderr[-3000:]
    return done


def verdicts(stderr: str) -> list[str]:
    """Every verdict hangwatch said (its kind in capitals), in order."""
    return [line for line in stderr.splitlines() if VERDICT.match(line)]


def saved(tmp_path) -> dict:
    return json.loads((tmp_path / "run" / "result.json").read_text())["verdict"]


def bundles(tmp_path) -> list:
    folder = tmp_path / "run" / "incidents"
    return sorted(folder.glob("incident-*")) if folder.is_dir() else []


def test_a_subgroup_collective_that_rank_1_skipped_names_rank_1_for_that_group(clean_lab, tmp_path):
    # Ranks 0,1 all_reduce on new_group([0, 1]) each step; from step 5 rank 1 skips it. Rank 0 waits
    # in the subgroup's all_reduce, ranks 1,2,3 in the default group's (DDP's): rank 0 is one
    # behind in the default group's numbers, which say nothing of a rank waiting in another group.
    # The mismatch is said as likely (a member that called one more looks the same): --stop-on-hang
    # acts on certain hangs only (issue 35), so the run ends by its own process-group timeout, a
    # consequence of the hang named first.
    before = counts(clean_lab)
    done = launched(clean_lab, tmp_path, "--stop-on-hang",
                    script_args=("--steps", "500", "--fault", "subgroup", "--rank", "1", "--at", "5",
                                 "--pg-timeout", "40"))
    said = verdicts(done.stderr)
    assert len(said) == 1 and said[0].startswith("ddp-preflight: hangwatch: MISMATCH: rank 1 never entered "
                                                 "all_reduce #"), done.stderr[-3000:]
    assert " of group [0,1], where rank 0 waits; rank 1 waits in all_reduce #" in said[0], said[0]
    verdict = saved(tmp_path)
    assert (verdict["kind"], verdict["culprits"], verdict["candidates"], verdict["reason"], verdict["certainty"],
            verdict["group_ranks"]) == ("mismatch", [1], [], "skipped-group", "likely", [0, 1]), verdict
    assert len(bundles(tmp_path)) == 1
    assert_nothing_left(clean_lab, before)


def test_a_timeout_cascade_is_the_consequence_of_the_hang_named_first(clean_lab, tmp_path):
    # init_process_group(timeout=20 s); rank 0 sleeps 90 s inside its loop. The hang is named while
    # the others wait; 20 s later their all_reduce times out, they exit 1, torchrun stops the rest.
    # None of that is a new verdict: the summary and result.json still name rank 0 alone.
    before = counts(clean_lab)
    done = launched(clean_lab, tmp_path, script_args=("--steps", "500", "--fault", "sleep", "--rank", "0",
                                                      "--at", "5", "--seconds", "90", "--pg-timeout", "20"))
    assert done.returncode == 1, done.stderr[-3000:]
    said = verdicts(done.stderr)
    assert len(said) == 1 and said[0].startswith("ddp-preflight: hangwatch: DEADLOCK: rank 0 "), done.stderr[-3000:]
    assert "Timed out" in done.stdout + done.stderr          # the victims' timeouts did happen
    verdict = saved(tmp_path)
    assert (verdict["kind"], verdict["culprits"], verdict["candidates"]) == ("deadlock", [0], []), verdict
    summary = done.stderr[done.stderr.index("ddp-preflight: training "):].splitlines()
    assert any(line.endswith(said[0].split(": DEADLOCK: ")[1]) or said[0].split(": DEADLOCK: ")[1] in line
               for line in summary[:2]), summary[:3]
    assert len(bundles(tmp_path)) == 1
    assert_nothing_left(clean_lab, before)


def test_stop_on_hang_freezes_and_stops_the_ranks_with_one_verdict_and_one_bundle(clean_lab, tmp_path):
    # ddp-preflight's own SIGSTOP of every rank (its stop's first step) is its own doing: never a
    # second DEADLOCK of "stopped" ranks, never a second bundle; result.json keeps the verdict.
    before = counts(clean_lab)
    done = launched(clean_lab, tmp_path, "--stop-on-hang",
                    script_args=("--steps", "500", "--fault", "leave", "--rank", "2", "--at", "5"))
    assert done.returncode == 1, done.stderr[-3000:]
    said = verdicts(done.stderr)
    assert len(said) == 1 and said[0].startswith("ddp-preflight: hangwatch: DEADLOCK: rank 2 left the loop"), \
        done.stderr[-3000:]
    verdict = saved(tmp_path)
    assert (verdict["kind"], verdict["culprits"], verdict["candidates"]) == ("deadlock", [2], []), verdict
    summary = done.stderr[done.stderr.index("ddp-preflight: training stopped"):].splitlines()
    assert summary[1].startswith("  the hang: rank 2 left the loop"), summary[:3]
    assert len(bundles(tmp_path)) == 1
    assert_nothing_left(clean_lab, before)
