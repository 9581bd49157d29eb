"""Every `ddp-preflight ...` example in README.md and docs/ runs as written: each is taken from
the docs' shell blocks and put through what the command does before it contacts a node (the real
argument parser, the launch's own checks, --env, parse_command), and its training command
through the launch-args check with this machine's real torchrun parser. An example --launch
would refuse fails here."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from ddp_preflight.cli import ddp_preflight, lab
from ddp_preflight.cli import explain as explain_cli
from ddp_preflight.launch import parse_command
from ddp_preflight.node.facts.launch import torchrun_parse
from ddp_preflight.preflight.checks import BY_ID, run_checks
from ddp_preflight.preflight.model import Context, NodeFacts, Options, Status
from ddp_preflight.rules.training_env import parse_env_args

REPO = Path(__file__).parents[2]
FENCE = re.compile(r"^\s*```(\w*)\s*$")
COMMAND = re.compile(r"^(?:\$ )?(ddp-preflight(?: |$).*)")

# Examples that show launch-args catching seed 000's `--run=x` on purpose (no --launch there):
# they must keep failing it, with torchrun's own words.
SHOWS_THE_FAILURE = {"docs/checks/launch-args.md", "docs/checks/README.md"}


def examples() -> list[tuple[str, str]]:
    """(file:line, command line) for each `ddp-preflight` line in a shell block of the docs,
    continuation lines joined."""
    out = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        lines, block, lang = path.read_text().splitlines(), False, ""
        at = 0
        while at < len(lines):
            fence = FENCE.match(lines[at])
            if fence:
                block, lang = not block, fence.group(1)
            elif block and lang in ("", "sh", "bash", "console", "shell"):
                found = COMMAND.match(lines[at].strip())
                if found:
                    start, text = at, found.group(1)
                    while text.endswith("\\") and at + 1 < len(lines):
                        at += 1
                        text = text[:-1] + " " + lines[at].strip()
                    out.append((f"{path.relative_to(REPO)}:{start + 1}", text))
            at += 1
    return out


EXAMPLES = examples()


def test_the_docs_have_examples_to_check():
    # launch.md's own, the checks' pages, the lab's: a change to the extraction that finds none fails.
    where = {w.split(":")[0] for w, _ in EXAMPLES}
    assert {"README.md", "docs/launch.md", "docs/quickstart.md", "docs/lab.md", "docs/checks/launch-args.md",
            "docs/checks/training-imports.md"} <= where
    assert len(EXAMPLES) >= 50


@pytest.mark.parametrize("where, line", EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_every_doc_example_is_accepted_as_written(where, line, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)          # --log-dir runs/... is judged where a user would run it
    argv = shlex.split(line, comments=True)[1:]
    for word in ("|", "||", ">", "&&"):  # `... --json > preflight.json`, `... || exit 1`
        if word in argv:
            argv = argv[:argv.index(word)]
    if argv[:1] == ["lab"]:
        lab._parser().parse_args(argv[1:])      # SystemExit (usage) fails the test
        return
    if argv[:1] == ["explain"]:
        explain_cli._parser().parse_args(argv[1:])   # its paths are read by its own tests
        return
    launch_args: list[str] = []
    if "--" in argv:
        launch_args = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    args = ddp_preflight._parser().parse_args(argv)
    request = ddp_preflight._launch_request(args, launch_args)     # UsageError: refused before any node
    parse_env_args(args.env, args.hosts or None)
    if args.launch:
        assert request == parse_command(launch_args)
    if not launch_args:
        return
    nproc = args.nproc_per_node or 1
    facts = {"launch": torchrun_parse(launch_args, max(1, len(args.hosts)), nproc)}
    ctx = Context((NodeFacts("master", facts),), Options(launch_args=tuple(launch_args), nproc_per_node=nproc))
    (result,) = run_checks(ctx, [BY_ID["launch-args"]])
    if where.split(":")[0] in SHOWS_THE_FAILURE and not args.launch:
        assert result.status is Status.FAIL
        assert result.summary.startswith("torchrun rejects the command: ambiguous option: --run=x could match")
    else:
        assert result.status is Status.PASS, (result.summary, result.fix)
