"""argparse as the commands use it: a usage mistake is one line naming what is wrong, what was
probably meant and where the help is, exit 2 (argparse's own prints the whole usage block first)."""

from __future__ import annotations

import argparse
import difflib
import os
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
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(Exit.USAGE)

    def parse_args(self, args=None, namespace=None):
        """argparse's, with what an unknown word was probably meant to be (from the words themselves)."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._instead(extras)}")
        return parsed

    def _check_value(self, action: argparse.Action, value) -> None:
        if action.choices is not None and value not in action.choices:
            choices = [str(c) for c in action.choices]
            meant = _nearest(str(value), choices, quote="'")
            raise argparse.ArgumentError(action, f"invalid choice: {value!r} (choose from "
                                                 f"{', '.join(map(repr, choices))}){meant}")

    def _instead(self, extras: list[str]) -> str:
        for word in extras:
            name = word.split("=", 1)[0]
            if self.otherwise and _script_here(word):      # `HOST --launch train.py ...`
                return f": {_script_here(word)}"
            if name in self.known:
                return f": {self.known[name]}"
            if name.startswith("-"):
                return _nearest(name, self._spellings()) or self.otherwise
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
# torchrun's that --launch sets itself (launch/plan.py): what it does instead.
_RESTARTS = "--launch runs torchrun with --max-restarts 0: a failed rank stops the run and is explained, not restarted"
_RDZV = "--launch runs torchrun with a static rendezvous at the master (--master-addr, --master-port)"
_OUTPUT = "--launch brings every rank's output here, each line prefixed, and keeps a log per node (--log-dir DIR)"
TORCHRUN_WORDS.update({"--max-restarts": _RESTARTS, "--max_restarts": _RESTARTS, "--rdzv-backend": _RDZV,
                       "--rdzv_backend": _RDZV, "--rdzv-id": _RDZV, "--rdzv_id": _RDZV, "--tee": _OUTPUT,
                       "--redirects": _OUTPUT})
# ssh's own options, which here come from the ssh config as ssh -F reads it.
SSH_WORDS = {
    "-F": "ssh's -F is --ssh-config FILE here",
    "-p": "ssh takes a node's port from the ssh config (Host NAME / Port N); give --ssh-config FILE",
    "-i": "ssh takes the key from the ssh config (Host NAME / IdentityFile PATH); give --ssh-config FILE",
    "-l": "give the user with the host, as ssh does: USER@HOST",
    "-J": "ssh takes a jump host from the ssh config (Host NAME / ProxyJump JUMP); give --ssh-config FILE",
}
SCRIPT_OPTIONS = ": if it is the training command's, put it after --: ddp-preflight HOST ... -- SCRIPT [ARGS]"


class PreflightParser(Parser):
    """ddp-preflight's: torchrun's and ssh's options say where they go here, an unknown one may be the
    training command's."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, known={**TORCHRUN_WORDS, **SSH_WORDS}, otherwise=SCRIPT_OPTIONS, **kw)


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


def nearest_checks(only: str | None) -> str:
    """--only's ids that are no check, each with the id meant where one is near."""
    from ddp_preflight.preflight.checks import BY_ID
    near = (difflib.get_close_matches(c, list(BY_ID), n=1, cutoff=0.75) for c in (only or "").split(",")
            if c not in BY_ID)
    meant = [found[0] for found in near if found]
    return f" (did you mean {', '.join(meant)}?)" if meant else ""


def ssh_config_missing(path: str, given: bool) -> str:
    """An ssh config that is no file: what it is, and where the name came from when not typed."""
    import os
    where = "" if given else " (from $DDP_PREFLIGHT_SSH_CONFIG)"
    what = "is a folder, not a file" if os.path.isdir(path) else "does not exist"
    return f"ssh config {path}{where} {what}: give an OpenSSH client config file (as ssh -F takes)"



def misspelt_command(argv: list[str]) -> None:
    """`ddp-preflight explian run/`: a first word near a command's name, before a path that is here,
    is that command misspelt, not a host (a host is never refused for its name alone); exit 2."""
    commands = ("explain",)
    if len(argv) > 1 and argv[0] not in commands and difflib.get_close_matches(argv[0], commands, n=1, cutoff=0.8) \
            and any(os.path.exists(word) for word in argv[1:]):
        meant = difflib.get_close_matches(argv[0], commands, n=1, cutoff=0.8)[0]
        print(f"ddp-preflight: error: {argv[0]!r} is no command, and {argv[1:][0]!r} is a path here: did you mean "
              f"ddp-preflight {meant} {' '.join(argv[1:])}? (see ddp-preflight --help)", file=sys.stderr)
        sys.exit(Exit.USAGE)
