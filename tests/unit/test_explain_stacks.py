"""py-spy dumps pasted as text are read into the evidence the live watcher reads from `py-spy dump
--json` and classified by its one classifier (hangwatch/classify.py). The recorded paste is
tests/unit/artifacts/pasted/217 (one process of a DeepSpeed run, py-spy 0.3's format); these are the
family's other shapes: several ranks by torch's prefixes, py-spy 0.2's hex thread ids and tab
frames, dumps with a Process line each, every rank in init_process_group, one rank elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_preflight.explain import explain
from ddp_preflight.explain.finding_text import finding_line


def _dump(rank: int | None, frames: list[str], pid: int = 100) -> str:
    p = f"[rank{rank}]:" if rank is not None else ""
    return "".join([f"{p}Process {pid + (rank or 0)}: python train.py\n", f"{p}Python v3.11.4 (/usr/bin/python3.11)\n",
                    "\n", f"{p}Thread {pid + (rank or 0)} (idle): \"MainThread\"\n"]
                   + [f"{p}    {f}\n" for f in frames]
                   + [f"{p}Thread 9{rank or 0}1 (idle): \"Thread-1\"\n", f"{p}    wait (threading.py:324)\n"])


ALL_REDUCE = ["all_reduce (torch/distributed/distributed_c10d.py:2050)", "wrapper (torch/distributed/c10d_logger.py:75)",
              "train_step (train.py:88)", "<module> (train.py:120)"]
INIT = ["_store_based_barrier (torch/distributed/distributed_c10d.py:1245)",
        "init_process_group (torch/distributed/distributed_c10d.py:1180)", "setup (train.py:30)", "<module> (train.py:118)"]
ELSEWHERE = ["_wait_for_data (data.py:41)", "train_step (train.py:80)", "<module> (train.py:120)"]


def _explain(tmp_path: Path, text: str):
    log = tmp_path / "paste.txt"
    log.write_text(text)
    return explain([str(log)])


def test_every_rank_waiting_in_one_collective_names_no_one_and_says_what_to_collect(tmp_path):
    f = _explain(tmp_path, "".join(_dump(r, ALL_REDUCE) for r in range(3))).finding
    assert f is not None
    assert (f.kind.value, f.cause.value, f.culprits, f.sure.value) == \
        ("timeout-unknown-root", "unknown-collect-flight-recorder", (), "unknown")
    assert [(s["rank"], s["state"], s["op"], s["line"]) for s in f.detail["stacks"]] == \
        [(r, "collective", "all_reduce", "train.py:88") for r in range(3)]
    assert "rank 1 waits in all_reduce at train.py:88" in finding_line(f)


def test_the_one_rank_not_in_the_collective_the_others_wait_in_is_behind(tmp_path):
    f = _explain(tmp_path, _dump(0, ALL_REDUCE) + _dump(1, ELSEWHERE) + _dump(2, ALL_REDUCE)).finding
    assert f is not None
    assert (f.kind.value, f.cause.value, f.culprits, f.sure.value) == ("rank-behind", "rank-behind-same-group", (1,),
                                                                       "likely")


def test_ranks_not_known_never_make_a_culprit(tmp_path):
    f = _explain(tmp_path, _dump(None, ALL_REDUCE, 10) + _dump(None, ELSEWHERE, 20)).finding
    assert f is not None
    assert (f.kind.value, f.culprits, f.sure.value) == ("timeout-unknown-root", (), "unknown")
    assert [s["pid"] for s in f.detail["stacks"]] == [10, 20]


def test_every_rank_in_init_process_group_is_a_rank_that_never_joined(tmp_path):
    f = _explain(tmp_path, _dump(0, INIT) + _dump(1, INIT)).finding
    assert f is not None
    assert (f.kind.value, f.cause.value, f.culprits, f.sure.value) == ("store-timeout", "ranks-never-joined", (), "likely")


def test_py_spy_0_2s_hex_threads_and_tab_frames_are_read(tmp_path):
    text = ("Thread 0x7F4AA36D9700 (active)\n\t _periodically_flush (ray/profiling.py:97)\n\t run (threading.py:864)\n"
            "Thread 0x7F4AACDE7700 (active)\n\t all_reduce (torch/distributed/distributed_c10d.py:907)\n"
            "\t train (train.py:61)\n\t <module> (train.py:70)\n")
    f = _explain(tmp_path, text).finding
    assert f is not None and f.message == "py-spy"
    assert [(s["state"], s["op"], s["line"]) for s in f.detail["stacks"]] == [("collective", "all_reduce", "train.py:61")]


def test_a_ranks_own_error_outranks_the_stacks(tmp_path):
    text = _dump(0, ALL_REDUCE) + "[rank1]: Traceback (most recent call last):\n[rank1]:   File \"train.py\", line 80\n" \
        "[rank1]: ValueError: bad batch\n"
    f = _explain(tmp_path, text).finding
    assert f is not None
    assert (f.kind.value, f.cause.value, f.culprits) == ("exited", "python-exception", (1,))


def test_words_that_look_like_a_dump_in_a_log_are_no_dump(tmp_path):
    assert _explain(tmp_path, "Thread pool started with 8 workers\nProcess group ready\nstep 10: loss 2.0\n").ok


def _prefixed(prefix: str, rank: int, frames: list[str]) -> str:
    """_dump's lines under a writer's prefix instead of torch's: {r} is the rank's number in it."""
    return "".join(prefix.format(r=rank) + line[len(f"[rank{rank}]:"):] if line.strip() else prefix.format(r=rank)
                   + "\n" for line in _dump(rank, frames).splitlines(keepends=True))


# issue 37: srun's "0: " label before an indented frame is one the normalizer does not strip, and the ranks'
# identical frame lines, the paste's longest, were taken for a terminal's wrap and joined: the frames were
# lost. Any per-line prefix, read as the dump's own lines carry it; a rank only where the prefix says one.
@pytest.mark.parametrize("prefix,ranked", [
    ("{r}: ", True), ("{r}:", True), ("[1,{r}]<stdout>:", True), ("2024-05-01 10:00:00 | rank {r} | ", True),
    ("node{r}: ", False), ("gpu-0{r} | ", False), ("[default{r}]:", False),
])
def test_py_spy_dumps_under_any_per_line_prefix_keep_their_frames(tmp_path, prefix, ranked):
    f = _explain(tmp_path, "".join(_prefixed(prefix, r, ELSEWHERE if r == 2 else ALL_REDUCE) for r in range(3))).finding
    assert f is not None and f.message == "py-spy"
    assert [(s["state"], s["op"], s["line"]) for s in f.detail["stacks"]] == \
        [("collective", "all_reduce", "train.py:88")] * 2 + [("idle", None, "data.py:41")]
    if ranked:
        assert (f.kind.value, f.culprits, f.sure.value) == ("rank-behind", (2,), "likely")
    else:       # a host's or a local index's prefix names no global rank: no culprit
        assert (f.kind.value, f.culprits, f.sure.value) == ("timeout-unknown-root", (), "unknown")


def test_the_recorded_dump_under_srun_labels_reads_as_it_does_bare(tmp_path):
    recorded = (Path(__file__).parent / "artifacts" / "pasted" / "217-deepspeed-py-spy-dump-one-rank-backward.log")
    bare = _explain(tmp_path, recorded.read_text()).finding
    labelled = _explain(tmp_path, "".join(f"3: {line}" for line in recorded.read_text().splitlines(keepends=True))).finding
    assert bare is not None and labelled is not None
    assert [(s["state"], s["op"], s["line"]) for s in labelled.detail["stacks"]] == \
        [(s["state"], s["op"], s["line"]) for s in bare.detail["stacks"]]
    assert [s["rank"] for s in labelled.detail["stacks"]] == [3] * len(bare.detail["stacks"])
