"""argparse as the commands use it: a usage mistake is one line naming what is wrong, what was
probably meant and where the help is, exit 2 (argparse's own prints the whole usage block first)."""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from typing import NoReturn

from .exit import Exit


def nproc(text: str) -> int | str:
    """--nproc-per-node: a whole number, or auto (torchrun's)."""
    if text == "auto":
        return text
    if text in ("gpu", "cpu"):     # torchrun's; here one word for both, as the run's device says
        raise argparse.ArgumentTypeError(f"{text!r} is torchrun's spelling: give auto (each node's GPUs on a CUDA "
                                         "run, its CPUs on a CPU run) or a number")
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number or auto") from None


class Help(argparse.HelpFormatter):
    """argparse's wrapping, paragraph by paragraph; a paragraph of indented lines under a title
    (the examples) is kept as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out: list[str] = []
        for block in text.split("\n\n"):
            lines = block.splitlines()
            if len(lines) > 1 and all(line.startswith("  ") for line in lines[1:]):
                out.append("\n".join(indent + line for line in lines))
            else:
                out.append(super()._fill_text(block, width, indent))
        return "\n\n".join(out)


class Parser(argparse.ArgumentParser):
    """`known` maps an option the command does not take, but users of a tool they know type (torchrun's
    --nnodes), to what to do instead; any other unknown option or choice gets its nearest spelling."""

    def __init__(self, *args, known: dict[str, str] | None = None, otherwise: str = "", **kw) -> None:
        kw.setdefault("formatter_class", Help)
        super().__init__(*args, **kw)
        self.known = known or {}
        self.otherwise = otherwise     # said of an unknown option with no near spelling

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}{self._instead(message)} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(Exit.USAGE)

    def _instead(self, message: str) -> str:
        unknown = re.fullmatch(r"unrecognized arguments: (.*)", message)
        if unknown:
            for word in unknown.group(1).split():
                name = word.split("=", 1)[0]
                if self.otherwise and _script_here(word):      # `HOST --launch train.py ...`
                    return f": {_script_here(word)}"
                if name in self.known:
                    return f": {self.known[name]}"
                if name.startswith("-"):
                    return _nearest(name, self._spellings()) or self.otherwise
            return ""
        choice = re.fullmatch(r"argument .*: invalid choice: '(.*)' \(choose from (.*)\)", message)
        if choice:
            return _nearest(choice.group(1), re.findall(r"'([^']*)'", choice.group(2)), quote="'")
        return ""

    def _spellings(self) -> list[str]:
        """Every option of this command and of its subcommands (argparse reports a subcommand's
        unknown options from the top parser)."""
        found: list[str] = []
        parsers = [self]
        while parsers:
            parser = parsers.pop()
            found.extend(s for s in parser._option_string_actions if s.startswith("--"))
            for action in parser._actions:
                if isinstance(action, argparse._SubParsersAction):
                    parsers.extend(action.choices.values())
        return found


def _nearest(word: str, spellings: list[str], quote: str = "") -> str:
    by_lower = {s.lower(): s for s in spellings}          # --backend NCCL means nccl
    close = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=0.75)
    return f": did you mean {quote}{by_lower[close[0]]}{quote}?" if close else ""


# torchrun's options that ddp-preflight decides itself, and where its own way of saying them is.
TORCHRUN_WORDS = {
    "--nnodes": "ddp-preflight counts the nodes from the hosts: list them (ddp-preflight master worker1 ...) "
                "or give --hostfile FILE",
    "--node-rank": "each node's rank is its place among the hosts (the first is the master, rank 0's node)",
    "--node_rank": "each node's rank is its place among the hosts (the first is the master, rank 0's node)",
    "--rdzv-endpoint": "the master is the first host; give its address and port with --master-addr and "
                       "--master-port",
    "--rdzv_endpoint": "the master is the first host; give its address and port with --master-addr and "
                       "--master-port",
    "--standalone": "with no HOST ddp-preflight checks (and --launch runs on) this machine alone",
    "-m": "the training command goes after --: ddp-preflight HOST ... -- -m MODULE [ARGS]",
}
SCRIPT_OPTIONS = ": if it is the training command's, put it after --: ddp-preflight HOST ... -- SCRIPT [ARGS]"


def host(text: str) -> str:
    """A HOST that is a Python file here is the training command put before its --."""
    said = _script_here(text)
    if said:
        raise argparse.ArgumentTypeError(said)
    return text


def _script_here(word: str) -> str:
    if word.endswith(".py") and os.path.isfile(word):
        return (f"{word} is a file here, not a host: the training command goes after --: "
                f"ddp-preflight HOST ... [--launch] -- {word} [ARGS]")
    return ""
