"""The collectors as one self-contained Python program, sent to the node's Python on stdin."""

from __future__ import annotations

import base64
import functools
import io
import json
import zipfile
from pathlib import Path

FACTS_DIR = Path(__file__).resolve().parents[1] / "facts"
PACKAGE = "ddp_preflight_facts"

_BOOT = """\
import base64, json, os, sys, tempfile, time
sys.stderr.write("DDP_PREFLIGHT_CLOCK %r\\n" % time.time())   # first: the clock sample
sys.stderr.flush()
fd, path = tempfile.mkstemp(prefix="ddp-preflight-", suffix=".zip")
os.write(fd, base64.b64decode({payload!r}))
os.close(fd)
try:
    sys.path.insert(0, path)
    from {package} import code, launch, main, network, processes, shards, system, torchinfo, util
    main.run(json.loads({request!r}))
finally:
    os.unlink(path)
"""


@functools.lru_cache(maxsize=1)
def payload() -> str:
    """The facts package, zipped; imported from the zip on the node (zipimport)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for source in sorted(FACTS_DIR.glob("*.py")):
            archive.write(source, f"{PACKAGE}/{source.name}")
    return base64.b64encode(buffer.getvalue()).decode()


def program(request: dict) -> str:
    return _BOOT.format(payload=payload(), package=PACKAGE, request=json.dumps(request))
