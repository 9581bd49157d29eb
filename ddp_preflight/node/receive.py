"""A file from the master, kept on the node for a while (py-spy for hangwatch's agent): in a
folder made for it now (mkdtemp: a fresh name, 0700, this user's alone), the file created there
and nowhere else (O_EXCL, no symlink followed). What is kept is removed by whoever it was for
(the agent removes py-spy's folder when its watch ends).

spec: {"program": "receive", "name": file name, "size": bytes, "mode": 0o700, "prefix": "hangwatch-"}
The file's bytes follow the spec on stdin. The last line is FILE {"path", "folder"}."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

from . import protocol


def main(spec: dict, work=None) -> int:
    size, name = int(spec["size"]), os.path.basename(spec["name"])
    folder = tempfile.mkdtemp(prefix=spec.get("prefix") or "ddp-preflight-")
    path = os.path.join(folder, name)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            left = size
            while left:
                chunk = sys.stdin.buffer.read(min(left, 1 << 20))
                if not chunk:
                    raise EOFError(f"the master sent {size - left} of {size} bytes")
                out.write(chunk)
                left -= len(chunk)
            os.fchmod(out.fileno(), int(spec.get("mode", 0o600)))
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    protocol.emit(protocol.FILE, {"path": path, "folder": folder})
    return 0
