"""No string a user reads names this project's own history: "seed 002", "the seeds' failures",
"issue 26" mean nothing to someone who installed the tool. Every string constant of the code (its
output, its help, its messages; docstrings and comments aside), the demo script and the pages a
newcomer reads (README, every docs page) say what happened instead."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
PACKAGES = ("ddp_preflight/cli", "ddp_preflight/tui", "ddp_preflight/lab", "ddp_preflight/launch", "ddp_preflight/rules", "ddp_preflight/transport", "ddp_preflight/explain", "ddp_preflight/preflight", "ddp_preflight/hangwatch", "ddp_preflight/node")  # noqa: E501
# Every page of the docs (a check's page shows that check's real output) and the demo script.
PAGES = sorted(["README.md", "scripts/demo.sh",
                *(p.relative_to(REPO).as_posix() for p in (REPO / "docs").rglob("*.md"))])
# "seed 002", "(seeds 001, 004)", "the seeds' faults", "issue 26"; not munge's --seed-file, a random seed's
# name, or SEED, a word of a training variable's name (node/secret_names.py: RANDOM_SEED is harmless).
HISTORY = re.compile(r"(?<![-.\w])[Ss]eeds?(?![-.\w])(?!\s*=)|\b[Ii]ssues? \d+")


def user_strings(path: Path):
    """(line, text) of every string constant but docstrings, and but a lab fault's provenance (the
    write-up it came from: lab/faults.py's FaultKind.seed, which nothing prints)."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant):
            skipped.add(id(body[0].value))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "FaultKind" and len(node.args) > 1:
            skipped.add(id(node.args[1]))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped:
            yield node.lineno, node.value


def test_the_scan_reads_every_package():
    # A folder that moved would be read as empty, and the scan below would find nothing in it.
    assert [package for package in PACKAGES if len(list((REPO / package).rglob("*.py"))) < 2] == []


def test_no_string_of_the_code_names_seeds_or_issues():
    found = [f"{path.relative_to(REPO)}:{line}: {text[:80]!r}"
             for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))
             for line, text in user_strings(path) if HISTORY.search(text)]
    assert found == []


@pytest.mark.parametrize("page", PAGES)
def test_no_page_of_the_docs_names_seeds_or_issues(page):
    lines = (REPO / page).read_text().splitlines()
    if page.endswith(".sh"):            # what the demo prints, not its comments
        lines = [line for line in lines if not line.lstrip().startswith("#")]
    assert [f"{page}:{n}: {line}" for n, line in enumerate(lines, 1) if HISTORY.search(line)] == []


def test_the_scan_finds_what_it_is_for(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""A docstring may say seed 002."""\nx = "fails with EADDRINUSE (seed 002)"\n'
                      'y = "the seeds\' faults"\nz = "see issue 26"\nw = "--seed-file=munged.seed"\n')
    assert [line for line, text in user_strings(sample) if HISTORY.search(text)] == [2, 3, 4]
