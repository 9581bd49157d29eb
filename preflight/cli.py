"""The `ddp-preflight` command: preflight on hosts, or `lab ...` for the lab."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["lab"]:
        from .lab.cli import main as lab_main
        return lab_main(argv[1:])
    print("ddp-preflight: the preflight checks are not built yet; try 'ddp-preflight lab up'",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
