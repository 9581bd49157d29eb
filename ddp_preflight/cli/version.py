"""This tool's version, as its package was installed (one answer for --version and the JSON report)."""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "ddp-preflight"


def version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:      # run from a checkout that was never installed
        return "unknown (not installed)"
