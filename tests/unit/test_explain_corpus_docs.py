"""The corpus's figures where people read them are the corpus's: docs/explain.md's right / partly /
wrong / "no failure found" (bench/explain_pasted.py's grading, computed here), and the pasted
corpus's README (how many logs, threads and repositories, the repositories most logs came from,
how many pastes of each part). A log added, or a rule that changes a verdict, fails this test until
the text says so."""

from __future__ import annotations

import collections
import importlib.util
import json
import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
PASTED = ROOT / "tests" / "unit" / "artifacts" / "pasted"
INDEX = json.loads((PASTED / "index.json").read_text())


def _bench():
    spec = importlib.util.spec_from_file_location("explain_pasted", ROOT / "bench" / "explain_pasted.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_explain_says_the_corpus_figures_explain_gets_now():
    bench = _bench()
    grades = collections.Counter(bench.grade(e["expected"], bench.answer(PASTED / e["file"])) for e in INDEX)
    text = " ".join((ROOT / "docs" / "explain.md").read_text().split())
    said = re.search(r"On the (\d+) logs users pasted .*? explain names (\d+) exactly .*?, (\d+) partly .*?, (\d+) "
                     r"wrong and (\d+) \"no failure found\"", text)
    assert said is not None
    assert tuple(map(int, said.groups())) == (len(INDEX), grades["right"], grades["partly"], grades["wrong"],
                                              grades["no failure found"])


def test_the_corpus_readme_counts_what_index_json_holds():
    text = " ".join((PASTED / "README.md").read_text().split())
    repos = collections.Counter("/".join(e["source"].split("/")[3:5]) for e in INDEX)
    threads = {e["source"].split("#")[0] for e in INDEX}
    said = re.search(r"(\d+) logs from (\d+) threads in (\d+) repositories", text)
    assert said is not None and tuple(map(int, said.groups())) == (len(INDEX), len(threads), len(repos))
    most = dict(re.findall(r"([\w.-]+/[\w.-]+) \((\d+)\)", text[text.index("most from"):]))
    assert most and {repo: int(n) for repo, n in most.items()} == {repo: repos[repo] for repo in most}
    assert all(n <= 2 for repo, n in repos.items() if repo not in most)      # "the rest one or two each"
    parts = collections.Counter(e["paste"] for e in INDEX)
    for part in ("whole", "head", "tail", "middle"):
        row = re.search(rf"\| {part} \| [^|]+ \| (\d+) \|", text)
        assert row is not None and int(row[1]) == parts[part], part
