"""The first program on a node (standard library only, Python 3.8+, self-contained: the package
is not importable until this has run). Everything arrives on stdin, which the master writes:
    8 digits: the size of this file's text, then the text (STAGE0, the only argv, runs it),
    b"DDP-PREFLIGHT-NODE 1 <zip size> <spec size>\\n", the node package as a zip, the spec (JSON),
then, for the programs that keep it, the control stream (control.py): heartbeats and commands.
So neither the package nor the orders (environments, tokens) ever show in the process list.

The zip goes into a private folder (mkdtemp: 0700, a fresh name, ours alone), which is also the
program's work folder; it is removed when the program ends, on SIGTERM too.

Nothing is imported from where another user can write (the caller's folder, another user's user
site or venv, a PYTHONPATH in the environment): the master runs `python -I -s -S -c STAGE0`,
STAGE0 keeps only absolute entries of sys.path before anything is imported, and the site is opened
only once node/trust.py has walked what it would read; else the program is refused with one line
the master explains."""

import json
import os
import shutil
import signal
import sys
import tempfile

MAGIC = b"DDP-PREFLIGHT-NODE"
VERSION = b"1"

# `python -I -s -S -c STAGE0`: reads this file's text from stdin and runs it. One short line, so that
# a --python that is not a Python says something readable about it. It first drops '' (the
# caller's folder, which -c puts first) and every relative entry: `import json` below must not
# find a json.py another user left there. The buffered reader loops until it has every byte
# asked for; everything after reads through it too.
STAGE0 = ('import sys; sys.path[:] = [p for p in sys.path if p[:1] == "/"]; '
          'exec(sys.stdin.buffer.read(int(sys.stdin.buffer.read(8))))')
# Before STAGE0, the flags of node/protocol.py (FLAGS): -I, no PYTHON* variable, no user site, no site.


def read_exact(stream, size):
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the master closed the stream before the payload ended")
    return data


def read_header(stream):
    line = stream.readline(200)
    if not line.endswith(b"\n"):
        raise EOFError("no header")
    parts = line.split()
    if len(parts) != 4 or parts[0] != MAGIC or parts[1] != VERSION:
        raise ValueError("not a ddp-preflight header (a different version on each side?)")
    return int(parts[2]), int(parts[3])


_HELD = None


def install(payload):
    """The package, in a private folder put first on sys.path: (folder, zip path)."""
    folder = tempfile.mkdtemp(prefix="ddp-preflight-node-")
    # Held open for the program's life: whose the folder is can be read from /proc (PID/fd), so a
    # folder left behind is told from one a live program still uses.
    global _HELD
    _HELD = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    path = os.path.join(folder, "node.zip")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(payload)
    sys.path.insert(0, path)
    return folder, path


def _terminated(signum, frame):
    raise SystemExit(128 + signum)      # unwinds: the program stops its own work, the folder goes


def main():
    if sys.version_info < (3, 8):
        # The node package needs 3.8 (this file alone parses on 3.4 and up): said as a verdict the
        # master reads (transport/errors.py), before an import would stop at a SyntaxError.
        sys.stderr.write("DDP_PREFLIGHT_PYTHON too-old %d.%d.%d\n" % tuple(sys.version_info[:3]))
        sys.stderr.flush()
        os._exit(126)
    try:
        stdin = sys.stdin.buffer
        zip_size, spec_size = read_header(stdin)
        payload = read_exact(stdin, zip_size)
        spec = json.loads(read_exact(stdin, spec_size).decode("utf-8"))
    except (ValueError, EOFError) as exc:
        sys.stderr.write("ddp-preflight node: cannot start: %s\n" % (exc,))
        sys.stderr.flush()
        os._exit(2)
    folder, path = install(payload)
    signal.signal(signal.SIGTERM, _terminated)
    code = 2
    try:
        from ddp_preflight.node.trust import REFUSED, open_site
        refused = open_site()
        if refused is not None:
            sys.stderr.write(refused.verdict() + "\n")
            code = REFUSED
        else:
            from ddp_preflight.node.programs import run
            code = run(spec, folder, path)
    finally:
        try:
            sys.stdout.flush()
        except Exception:
            pass
        shutil.rmtree(folder, ignore_errors=True)
    # Not sys.exit: a daemon thread blocked on a read of stdin (control.py) holds the buffered
    # reader's lock, and the interpreter's own exit would wait on it.
    os._exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
