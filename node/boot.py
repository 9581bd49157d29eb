"""The first program on a node, run as `python -c <this file's text>` (standard library only,
Python 3.8+, self-contained: the package is not importable until this has run).

It reads its stdin, which the master writes:
    b"DDP-PREFLIGHT-NODE 1 <zip size> <spec size>\\n", the node package as a zip, the spec (JSON),
then, for the programs that keep it, the control stream (control.py): heartbeats and commands.
So neither the package nor the orders (environments, tokens) ever show in the process list.

The zip goes into a private folder (mkdtemp: 0700, a fresh name, ours alone), which is also the
program's work folder; it is removed when the program ends, on SIGTERM too."""

import json
import os
import shutil
import signal
import sys
import tempfile

MAGIC = b"DDP-PREFLIGHT-NODE"
VERSION = b"1"


def read_exact(fd, size):
    chunks = []
    while size:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            raise EOFError("the master closed the stream before the payload ended")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def read_header(fd):
    # Byte by byte, unbuffered: what follows the header belongs to the program's own reads of fd 0.
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte:
            raise EOFError("no header")
        line += byte
        if len(line) > 200:
            raise ValueError("not a ddp-preflight header")
    parts = line.split()
    if len(parts) != 4 or parts[0] != MAGIC or parts[1] != VERSION:
        raise ValueError("not a ddp-preflight header (a different version on each side?)")
    return int(parts[2]), int(parts[3])


def install(payload):
    """The package, in a private folder put first on sys.path: (folder, zip path)."""
    folder = tempfile.mkdtemp(prefix="ddp-preflight-node-")
    path = os.path.join(folder, "node.zip")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(payload)
    sys.path.insert(0, path)
    return folder, path


def _terminated(signum, frame):
    raise SystemExit(128 + signum)      # unwinds: the program stops its own work, the folder goes


def main():
    try:
        zip_size, spec_size = read_header(0)
        payload = read_exact(0, zip_size)
        spec = json.loads(read_exact(0, spec_size).decode("utf-8"))
    except (ValueError, EOFError) as exc:
        sys.stderr.write("ddp-preflight node: cannot start: %s\n" % (exc,))
        sys.stderr.flush()
        os._exit(2)
    folder, path = install(payload)
    signal.signal(signal.SIGTERM, _terminated)
    code = 2
    try:
        from node.programs import run
        code = run(spec, folder, path)
    finally:
        try:
            sys.stdout.flush()
        except Exception:
            pass
        shutil.rmtree(folder, ignore_errors=True)
    # Not sys.exit: a daemon thread blocked on a read must not hold the interpreter's exit.
    os._exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
