"""explain reads a log the same however it was pasted: every log of the pasted corpus
(tests/unit/artifacts/pasted/), hard-wrapped by a terminal at 80, 100 or 120 columns, with CRLF
endings, colour codes, markdown fences or quotes, or a launcher's or logger's prefix that names no
rank, gets the verdict the log itself gets; with its head or tail cut, the same verdict or a weaker
one (fewer culprits, less sure, or none), never another culprit."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from ddp_preflight.explain import explain
from ddp_preflight.explain.paste import lines_of, wrap_width

PASTED = Path(__file__).parent / "artifacts" / "pasted"
INDEX = json.loads((PASTED / "index.json").read_text())
SURE = {"unknown": 0, "likely": 1, "certain": 2}


def verdict(path: Path) -> tuple | None:
    f = explain([str(path)]).finding
    return None if f is None else (f.kind.value, tuple(f.culprits), f.sure.value, f.cause.value)


def wrapped(text: str, width: int) -> str:
    """What a terminal `width` columns wide shows: every longer line cut into pieces of that width."""
    out = []
    for line in text.split("\n"):
        while len(line) > width:
            out.append(line[:width])
            line = line[width:]
        out.append(line)
    return "\n".join(out)


def prefixed(prefix: str) -> Callable[[str], str]:
    return lambda text: "\n".join(prefix + line for line in text.split("\n"))


def cut(text: str, head: bool) -> str:
    lines = text.split("\n")
    k = max(1, len(lines) // 5)
    return "\n".join(lines[k:] if head else lines[:-k])


SAME: dict[str, Callable[[str], str]] = {
    "wrapped-80": lambda t: wrapped(t, 80),
    "wrapped-100": lambda t: wrapped(t, 100),
    "wrapped-120": lambda t: wrapped(t, 120),
    "crlf": lambda t: t.replace("\n", "\r\n"),
    "colours": lambda t: "\n".join(f"\x1b[1;31m{line}\x1b[0m" if line else line for line in t.split("\n")),
    "fenced": lambda t: "```text\n" + t + "\n```\n",
    "quoted": prefixed("> "),
    "stderr": prefixed("stderr: "),
    "glog": prefixed("I0325 20:57:27.620000 2606 train.py:12] "),
    "timestamps": prefixed("2024-05-01 10:00:00,123 "),
    "deepspeed": prefixed("[2023-04-14 13:11:27,885] [INFO] [launch.py:318:main] "),
    # a terminal wraps what it shows: colour codes take no column
    "crlf-colours-wrapped": lambda t: "\r\n".join(f"\x1b[33m{line}" for line in wrapped(t, 100).split("\n")),
}
WEAKER: dict[str, Callable[[str], str]] = {
    # Ray's worker prefix names a host: a rank numbered per node is no longer a global rank
    "ray": prefixed("(RayWorkerWrapper pid=1978, ip=10.41.0.8) "),
    "head-cut": lambda t: cut(t, head=True),
    "tail-cut": lambda t: cut(t, head=False),
    "line-cut-at-both-ends": lambda t: t[7:-7],
}


def _changed(tmp_path: Path, change: Callable[[str], str]) -> list[tuple[str, tuple | None, tuple | None]]:
    out = []
    for entry in INDEX:
        path = PASTED / entry["file"]
        changed = tmp_path / entry["file"]
        changed.write_bytes(change(path.read_text(errors="replace")).encode())
        out.append((entry["file"], verdict(path), verdict(changed)))
    return out


@pytest.mark.parametrize("name", sorted(SAME))
def test_a_paste_reads_the_same_however_it_was_pasted(name, tmp_path):
    assert [(f, whole, got) for f, whole, got in _changed(tmp_path, SAME[name]) if got != whole] == []


def weaker_or_same(whole: tuple | None, got: tuple | None) -> bool:
    """The same verdict, none, or one that names no rank the whole log does not, no surer of them
    (where the whole named none, not certain of one)."""
    if got is None or got == whole:
        return True
    if whole is None:
        return False                 # a false alarm
    if not whole[1]:
        return SURE[got[2]] < SURE["certain"] or not got[1]
    fewer = set(got[1]) < set(whole[1]) and (got[0], got[3]) == (whole[0], whole[3])    # the same cause, of fewer
    return set(got[1]) <= set(whole[1]) and (SURE[got[2]] <= SURE[whole[2]] or fewer)


@pytest.mark.parametrize("name", sorted(WEAKER))
def test_a_cut_or_renumbered_paste_never_names_another_culprit(name, tmp_path):
    assert [r for r in _changed(tmp_path, WEAKER[name]) if not weaker_or_same(r[1], r[2])] == []


def test_a_terminals_hard_wrap_is_joined_and_a_rule_is_not():
    rule = "=" * 60
    wide = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1089"
    text = wrapped("\n".join([rule, "train.py FAILED", rule, wide, wide.replace("1089", "1090")]), 80)
    assert wrap_width(text.split("\n")) == 80
    assert [line for _, line in lines_of(text)] == [rule, "train.py FAILED", rule, wide, wide.replace("1089", "1090")]
    assert [n for n, _ in lines_of(text)] == [1, 2, 3, 4, 6]


def test_a_message_wrapped_at_a_space_is_read_across_the_break():
    text = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:799] connect [127.0.1.1]:29591: Connection\n" \
           "reset by peer\nnext line"
    assert [line for _, line in lines_of(text)] == [
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:799] connect [127.0.1.1]:29591: Connection "
        "reset by peer", "next line"]


def test_two_lines_that_start_as_lines_start_are_never_joined():
    # eight ranks' watchdog lines of one length are the paste's longest: no terminal wrapped them
    lines = [f"[rank{r}]:[E1206 10:00:00.000 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective "
             f"operation timeout: WorkNCCL(SeqNum=6, OpType=ALLREDUCE)" for r in range(8)]
    assert [line for _, line in lines_of("\n".join(lines))] == lines
