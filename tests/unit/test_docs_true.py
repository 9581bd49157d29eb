"""The pages a newcomer reads first say what the tool really does: README lists every check
`ddp-preflight --list` prints and every fault `ddp-preflight lab faults` prints (both read from
the real commands), docs/lab.md has a row for each fault, and the hang the demo, the docs and the
dashboard's screenshot show is at the lines of examples/hang_train.py where it really is."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]


def first_words(*args: str) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "ddp_preflight", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=60, check=True)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def test_readme_names_every_check_that_list_prints():
    checks = first_words("--list")
    readme = (REPO / "README.md").read_text()
    assert len(checks) >= 29
    assert [c for c in checks if f"`{c}`" not in readme] == []


def test_readme_and_the_lab_page_name_every_fault_the_lab_has():
    faults = first_words("lab", "faults")
    readme, lab = (REPO / "README.md").read_text(), (REPO / "docs" / "lab.md").read_text()
    assert len(faults) >= 12
    assert [f for f in faults if f"`{f}`" not in readme] == []
    assert [f for f in faults if f"| `{f}@NODE" not in lab] == []


def hang_lines() -> tuple[int, int]:
    """Where the demo's deadlock is in examples/hang_train.py: rank 3's sleep after it left the
    loop (`--fault leave`), and the others' line in train_step (the backward's all_reduce)."""
    lines = (REPO / "examples" / "hang_train.py").read_text().splitlines()
    leave = next(n for n, line in enumerate(lines, 1) if 'args.fault in ("leave", "child")' in line and "if mine" in line)
    start = next(n for n, line in enumerate(lines, 1) if line.startswith("def train_step"))
    backward = next(n for n, line in enumerate(lines[start:], start + 1) if "loss.backward()" in line)
    return leave + 1, backward


PAGES = sorted(["README.md", *(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md"))])


@pytest.mark.parametrize("page", PAGES)
def test_the_demo_hang_is_where_the_example_has_it(page):
    """Every page that shows hang_train.py's deadlock (rank R left the loop, the others wait in the
    backward's all_reduce) gives the lines the example has now."""
    idle, backward = hang_lines()
    text = (REPO / page).read_text()
    assert "time.sleep(3600)" in (REPO / "examples" / "hang_train.py").read_text().splitlines()[idle - 1]
    said_idle = {int(n) for n in re.findall(r"(?:idle|left the loop) at hang_train\.py:(\d+)", text)}
    said_wait = {int(n) for n in re.findall(r"all_reduce (?:at hang_train\.py:(\d+) \(train_step\)|\(hang_train\.py:(\d+)\))",
                                            text) for n in n if n}
    assert said_idle <= {idle}
    assert said_wait <= {backward}
    if page in ("README.md", "docs/quickstart.md"):     # the pages that show the demo's own line
        assert said_idle == {idle}


def screen_text(svg: Path) -> str:
    """What a dashboard screenshot shows: Textual's SVG has a <text> per run of one style, in
    reading order, with its spaces written &#160;."""
    return html.unescape("".join(re.findall(r"<text [^>]*>([^<]*)</text>", svg.read_text()))).replace("\xa0", " ")


def test_the_dashboards_screenshot_shows_the_demos_hang_where_the_example_has_it():
    """docs/img/dashboard-deadlock.svg (the quickstart's step 6, a real run) names rank 3 idle at
    the line after the loop and the others in the backward's all_reduce, as the example is now."""
    idle, backward = hang_lines()
    shown = screen_text(REPO / "docs" / "img" / "dashboard-deadlock.svg")
    assert "DEADLOCK" in shown and "look at rank 3" in shown
    assert f"rank 3 left the loop: idle at hang_train.py:{idle} (main); ranks 0,1,2 wait in all_reduce" in shown
    assert {int(n) for n in re.findall(r"hang_train\.py:(\d+)", shown)} == {idle, backward}


def test_the_screen_text_of_a_screenshot_is_read_whole(tmp_path):
    svg = tmp_path / "shot.svg"
    svg.write_text('<text class="r1" x="0" y="1">idle&#160;at&#160;hang_</text><text x="9" y="1">train.py:83</text>')
    assert screen_text(svg) == "idle at hang_train.py:83"


def test_the_quickstart_does_not_hard_code_the_default_labs_paths_in_what_to_type():
    """Output blocks show a real run's paths; the commands a reader types take them from the lab."""
    text = (REPO / "docs" / "quickstart.md").read_text()
    typed = [line for block in re.findall(r"```sh\n(.*?)```", text, re.S) for line in block.splitlines()]
    assert [line for line in typed if "/run/ddp-preflight/lab" in line] == []
