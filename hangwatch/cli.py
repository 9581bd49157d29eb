"""The `hangwatch` command. Its classifier and diagnosis exist (classify.py, diagnose.py);
the sampling agent and `attach` come with the hangwatch issue."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("hangwatch: 'attach' is not built yet; the rank classifier and diagnosis are "
          "(hangwatch/classify.py, hangwatch/diagnose.py)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
