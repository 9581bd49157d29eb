"""What the master writes on a node program's stdin: the node package as a zip, built once from
the node/ folder, and the program's spec (boot.py reads them). The argv is only the boot text."""

from __future__ import annotations

import functools
import io
import json
import zipfile
from pathlib import Path

from ddp_preflight import node
from ddp_preflight.node import boot, protocol

from .errors import python_argv

NODE_DIR = Path(node.__file__).resolve().parent
BOOT = Path(boot.__file__).read_text()


@functools.lru_cache(maxsize=1)
def package_zip() -> bytes:
    """node/ and its subpackages' .py files, as `ddp_preflight/node/...` in a zip (zipimport on the node)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.write(NODE_DIR.parent / "__init__.py", "ddp_preflight/__init__.py")
        for source in sorted(NODE_DIR.rglob("*.py")):
            if "__pycache__" not in source.parts:
                archive.write(source, "ddp_preflight/node/" + source.relative_to(NODE_DIR).as_posix())
    return buffer.getvalue()


def stdin_payload(spec: dict) -> bytes:
    text = BOOT.encode()
    package = package_zip()
    orders = json.dumps(spec).encode()
    header = boot.MAGIC + b" " + boot.VERSION + b" %d %d\n" % (len(package), len(orders))
    return b"%08d" % len(text) + text + header + package + orders


def boot_argv(python: str) -> list[str]:
    """`python -s -S -c STAGE0` (it reads boot.py from stdin), behind a few lines of sh that say
    what --python is when it cannot run, and refuse one another user can change."""
    return python_argv(python, *protocol.FLAGS, "-c", boot.STAGE0)
