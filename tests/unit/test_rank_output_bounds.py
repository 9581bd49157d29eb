"""Memory bounded per line and per rank whatever a rank prints (issue 34 part B): torchrun's --tee
on the node in bounded memory (node/tail.py), and each cut line says how much was left out (the
master's reading was bounded already: transport/lines.py cuts a line at 64 KiB)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from ddp_preflight.node.tail import MAX_LINE, LineCutter

from .ports import free_port

ROOT = Path(__file__).parents[2]


def test_a_line_keeps_its_first_bytes_and_says_how_many_were_left_out_across_chunks():
    cutter = LineCutter(max_line=10)
    out = cutter.feed(b"short\n0123456789ab")
    out += cutter.feed(b"cdef" * 1000)
    out += cutter.feed(b"gh\nnext\npart")
    assert out == ["short", "0123456789 [... 4004 more bytes of this line left out]", "next"]
    assert cutter.rest() == ["part"] and cutter.rest() == []
    # A cut inside a character shows it replaced: bytes, not characters, are counted.
    assert LineCutter(max_line=3).feed("éé\n".encode()) == ["é\ufffd [... 1 more bytes of this line left out]"]


BIG = """import sys
chunk = "x" * (1 << 20)
for _ in range(%d):
    sys.stdout.write(chunk)
sys.stdout.write("\\n")
print("done", flush=True)
"""


def _high_water(root: int, peaks: dict, stop: threading.Event) -> None:
    """Each process's peak resident memory (VmHWM, kB) in the tree under root, ranks apart (a
    rank's memory is its own: it built what it prints)."""
    while not stop.is_set():
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(ppid, []).append(int(entry))
        tree, at = [root], 0
        while at < len(tree):
            tree += children.get(tree[at], [])
            at += 1
        for pid in tree:
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes()
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            if environ.startswith(b"RANK=") or b"\0RANK=" in environ:
                continue
            kb = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM")), 0)
            peaks[pid] = max(peaks.get(pid, 0), kb)
        time.sleep(0.1)


def test_a_rank_printing_256_mib_in_one_line_costs_the_launch_no_more_than_a_line(tmp_path):
    """A real launch of a rank that prints 256 MiB in one line: the master and every node program
    stay under 400 MB (torch's own import is about 210 MB: the launch program and the bootstrap
    import it; the launch program held 1,235 MB before), and the line in the node's log and on
    the terminal keeps 63 KiB and says how many bytes were left out."""
    mib = 256
    script = tmp_path / "big.py"
    script.write_text(BIG % mib)
    log_dir = tmp_path / "run"
    launch = subprocess.Popen([sys.executable, "-m", "ddp_preflight", "--no-probes", "--force", "--master-port",
                               str(free_port()), "--launch", "--log-dir", str(log_dir), "--", str(script)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    peaks: dict[int, int] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=_high_water, args=(launch.pid, peaks, stop), daemon=True)
    watcher.start()
    try:
        stdout, stderr = launch.communicate(timeout=300)
    finally:
        stop.set()
        watcher.join(5)
    assert launch.returncode == 0, stderr.decode()[-3000:]
    assert peaks.get(launch.pid, 0) < 200 * 1024, f"master: {peaks.get(launch.pid, 0) // 1024} MB"
    heavy = {pid: kb // 1024 for pid, kb in peaks.items() if kb >= 400 * 1024}
    assert not heavy, f"processes over 400 MB: {heavy}"
    said = f" [... {mib * (1 << 20) - MAX_LINE} more bytes of this line left out]"
    logged = [line for line in (log_dir / f"{os.uname().nodename}.log").read_text().splitlines()
              if line.startswith("[") and " r0] x" in line]
    assert len(logged) == 1 and logged[0].endswith("x" * 100 + said), logged[0][-200:] if logged else logged
    assert len(logged[0]) < 64 * 1024
    shown = [line for line in stdout.decode().splitlines() if " r0] x" in line]
    assert len(shown) == 1 and shown[0].endswith(said)


FORGE = """import os
with open(f"/proc/{os.getppid()}/fd/1", "w") as out:      # its launcher's stdout, past torchrun's tee
    for _ in range(%d):
        out.write("DDP_PREFLIGHT_LAUNCH " + "y" * (32 << 20) + "\\n")
        out.flush()
print("done", flush=True)
"""


def test_marked_lines_a_rank_forges_into_its_launchers_stdout_are_kept_as_a_line_each(tmp_path):
    """A rank writes six 32 MiB lines that start with the launch program's marker straight into
    its launcher's stdout: each fails its signature and is kept, logged and shown as text cut at
    64 KiB (before, each was kept whole: the master held 289 MB after four, growing with each);
    the reader cuts each at 64 KiB as it reads it (no announcement came), so the master's peak
    stays under 200 MB."""
    lines = 6
    script = tmp_path / "forge.py"
    script.write_text(FORGE % lines)
    log_dir = tmp_path / "run"
    launch = subprocess.Popen([sys.executable, "-m", "ddp_preflight", "--no-probes", "--force", "--master-port",
                               str(free_port()), "--launch", "--log-dir", str(log_dir), "--", str(script)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    peaks: dict[int, int] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=_high_water, args=(launch.pid, peaks, stop), daemon=True)
    watcher.start()
    try:
        stdout, stderr = launch.communicate(timeout=300)
    finally:
        stop.set()
        watcher.join(5)
    assert launch.returncode == 0, stderr.decode()[-3000:]
    assert peaks.get(launch.pid, 0) < 200 * 1024, f"master: {peaks.get(launch.pid, 0) // 1024} MB"
    forged = "DDP_PREFLIGHT_LAUNCH " + "y" * (32 << 20)
    said = f"(unsigned marker, shown as text) {forged[:64 * 1024]} [... {len(forged) - 64 * 1024} more bytes " \
           "of this line left out]"       # cut while read: never held whole
    logged = [line for line in (log_dir / f"{os.uname().nodename}.log").read_text().splitlines() if "yyyy" in line]
    assert logged == [f"[{os.uname().nodename}] {said}"] * lines, [line[-120:] for line in logged]
