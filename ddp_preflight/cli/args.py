"""argparse as the commands use it: a usage mistake is one line naming what is wrong and where
the help is, exit 2 (argparse's own prints the whole usage block first)."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from .exit import Exit


def nproc(text: str) -> int | str:
    """--nproc-per-node: a whole number, or auto (torchrun's)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number or auto") from None


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(Exit.USAGE)
