"""The relay: one per node of a Slurm job, all started by ONE `srun --overlap` step, carrying
that node's node programs over the step's per-task stdio (transport/slurm.py is the master's
side). It is to srun what the ssh connection is to an SshNode: the master opens a channel per
program; each channel is a process started here with pipes, as sshd would start it.

Lines, both ways, one frame each: `RELAY <task> <channel> <op> <base64>`.
- master -> relays (srun gives every task all of stdin; each keeps the lines for its own task,
  or for "*"): `open` (JSON: argv, and `boot`: a spec, when the program is booted from this
  relay's own copy of the package, so only the spec crosses the wire), `in` (bytes for its
  stdin), `eof` (close its stdin), `kill` (SIGTERM).
- relay -> master: `hello` (JSON: Slurm's node name, the hostname), `out` and `err` (bytes; an
  empty one is the end of that stream), `exit` (its exit status, after both streams ended).
A frame the relay writes stays under MAX_FRAME bytes: srun forwards a task's output in messages
of at most 1024 bytes, so a longer line could be cut and interleaved with another task's.
Each frame a relay writes is signed with the key of its spec (node/signing.py: a tag after the
frame): a rank on the node can write to its relay's stdout too, and must not end another
program's channel ("exit"), speak in it ("out") or claim a node ("hello"). The master drops a
frame whose tag fails.

The master closing its side (stdin EOF), or SIGTERM from Slurm ending the step: every program
started here gets EOF on its stdin (node/control.py: a stop), then SIGTERM after GRACE seconds.
Standard library only, Python 3.8+."""

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile

from . import signing

TAG = "RELAY"
BROADCAST = "*"
MAX_FRAME = 1000             # bytes of one line this relay writes, newline included
CHUNK = 600                  # raw bytes per out/err frame: base64 makes 800, plus the header and the
                             # signature's tag (about 50)
GRACE = 10.0                 # seconds a program has to stop on its own once the master is gone


def frame(task, channel, op, data=b""):
    """One line of the relay protocol (both sides use it)."""
    return ("%s %s %s %s %s\n" % (TAG, task, channel, op, base64.b64encode(data).decode())).encode()


def parse(line):
    """(task, channel, op, data) of one frame, or None for a line that is not one."""
    parts = line.split()
    if len(parts) not in (4, 5) or parts[0] != (TAG.encode() if isinstance(line, bytes) else TAG):
        return None
    try:
        data = base64.b64decode(parts[4]) if len(parts) == 5 else b""
        task, channel, op = (p.decode() if isinstance(p, bytes) else p for p in parts[1:4])
        return task, int(channel), op, data
    except (ValueError, TypeError):
        return None


class Relay:
    def __init__(self, task, zip_path, out_fd=1):
        self.task, self.zip_path, self.out_fd = task, zip_path, out_fd
        self.children = {}           # channel -> Popen
        self.inputs = {}             # channel -> its stdin writer
        self._lock = threading.Lock()
        self._boot = None

    def say(self, channel, op, data=b""):
        text = frame(self.task, channel, op, data)[:-1].decode()
        with self._lock:       # signed under the lock: this relay's counts reach the master in order
            line = (signing.sign(text) + "\n").encode()
            try:
                os.write(self.out_fd, line)
            except OSError:
                pass

    def hello(self):
        me = {"node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
              "host": socket.gethostname(), "pid": os.getpid()}
        self.say(0, "hello", json.dumps(me).encode())

    def boot_payload(self, spec):
        """What boot.py reads, built here from this relay's own package: only the spec came."""
        if self._boot is None:
            with open(self.zip_path, "rb") as f:
                package = f.read()
            with zipfile.ZipFile(self.zip_path) as archive:
                text = archive.read("ddp_preflight/node/boot.py")
            self._boot = (text, package)
        text, package = self._boot
        from ddp_preflight.node import boot
        orders = json.dumps(spec).encode()
        header = boot.MAGIC + b" " + boot.VERSION + b" %d %d\n" % (len(package), len(orders))
        return b"%08d" % len(text) + text + header + package + orders

    # -- the master's frames --------------------------------------------------------------------
    def handle(self, channel, op, data):
        if op == "open":
            self.open(channel, json.loads(data.decode()))
        elif op == "in":
            writer = self.inputs.get(channel)
            if writer is not None:
                writer.put(data)
        elif op == "eof":
            writer = self.inputs.get(channel)
            if writer is not None:
                writer.put(None)
        elif op == "kill":
            child = self.children.get(channel)
            if child is not None and child.poll() is None:
                try:
                    child.terminate()
                except OSError:
                    pass

    def open(self, channel, request):
        try:
            child = subprocess.Popen(request["argv"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            self.say(channel, "err", ("ddp-preflight relay: cannot start %s: %s\n"
                                      % (request["argv"][0], exc)).encode())
            self.say(channel, "err")
            self.say(channel, "out")
            self.say(channel, "exit", b"127")
            return
        self.children[channel] = child
        writer = _Writer(child.stdin)
        self.inputs[channel] = writer
        if request.get("boot") is not None:
            writer.put(self.boot_payload(request["boot"]))
        readers = [threading.Thread(target=self._pump, args=(channel, child.stdout, "out"), daemon=True),
                   threading.Thread(target=self._pump, args=(channel, child.stderr, "err"), daemon=True)]
        for reader in readers:
            reader.start()
        threading.Thread(target=self._reap, args=(channel, child, readers), daemon=True).start()

    def _pump(self, channel, stream, op):
        while True:
            try:
                data = os.read(stream.fileno(), CHUNK)
            except OSError:
                data = b""
            if not data:
                self.say(channel, op)
                return
            self.say(channel, op, data)

    def _reap(self, channel, child, readers):
        code = child.wait()
        for reader in readers:
            reader.join()
        self.inputs.pop(channel, None)
        self.children.pop(channel, None)
        self.say(channel, "exit", str(code if code >= 0 else 128 - code).encode())

    # -- the end ----------------------------------------------------------------------------------
    def end(self):
        """The master is gone: EOF to every program, then SIGTERM to those still running."""
        for writer in list(self.inputs.values()):
            writer.put(None)
        deadline = time.monotonic() + GRACE
        while time.monotonic() < deadline and any(c.poll() is None for c in list(self.children.values())):
            time.sleep(0.05)
        for child in list(self.children.values()):
            if child.poll() is None:
                try:
                    child.terminate()
                except OSError:
                    pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(c.poll() is None for c in list(self.children.values())):
            time.sleep(0.05)


class _Writer:
    """A program's stdin, written from its own thread: one program that does not read its
    input must not stop the frames of the others."""

    def __init__(self, stream):
        self.stream = stream
        self.items = []
        self.ready = threading.Condition()
        threading.Thread(target=self._write, daemon=True).start()

    def put(self, data):
        with self.ready:
            self.items.append(data)
            self.ready.notify()

    def _write(self):
        while True:
            with self.ready:
                while not self.items:
                    self.ready.wait()
                data = self.items.pop(0)
            try:
                if data is None:
                    self.stream.close()
                    return
                self.stream.write(data)
                self.stream.flush()
            except (OSError, ValueError):
                return


def main(spec, work):
    task = os.environ.get("SLURM_PROCID", "0")
    relay = Relay(task, work.zip_path)
    # Slurm ends a step with SIGTERM: boot.py's handler unwinds through the finally below.
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # srun's Ctrl-C is the master's to handle
    relay.hello()
    stdin = sys.stdin.buffer
    try:
        while True:
            line = stdin.readline()
            if not line:
                break
            found = parse(line)
            if found is None:
                continue
            target, channel, op, data = found
            if target == task or target == BROADCAST:
                relay.handle(channel, op, data)
    finally:
        relay.end()
    return 0
