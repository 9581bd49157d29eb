"""What the nodes run, seen by a careful, hostile user (issue 10): no secret in any process list,
no stranger that can fake a finding, no line that can swallow the launcher, nothing left
behind on a node, and no node that trains on after its master is gone."""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from .test_launch_lab import CLI, NODES, REPO, assert_nothing_left, command, counts


def argv_words(lab) -> dict[int, list[str]]:
    """Every process's command line on every lab node, with base64 words decoded too."""
    out = {}
    for node in NODES:
        for pid in lab.processes(node):
            try:
                words = [w.decode(errors="replace")
                         for w in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if w]
            except OSError:
                continue
            for word in list(words):
                try:
                    words.append(base64.b64decode(word, validate=True).decode(errors="replace"))
                except (binascii.Error, ValueError):
                    pass
            out[pid] = words
    return out


def test_a_secret_given_with_env_never_shows_in_a_process_list_on_any_node(clean_lab, tmp_path):
    secret = "s3cr3t" + os.urandom(8).hex()
    argv = command(clean_lab, tmp_path, "--no-probes", "--env", f"HF_TOKEN={secret}",
                   script_args=("--steps", "1000", "--step-time", "0.2"))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        deadline, seen = time.monotonic() + 120, False
        for line in proc.stdout:
            if " step 1 loss" in line:
                seen = True
                break
            if time.monotonic() > deadline:
                break
        assert seen, "the training never stepped"
        leaks = {pid: [w for w in words if secret in w] for pid, words in argv_words(clean_lab).items()}
        assert not any(leaks.values()), {pid: w for pid, w in leaks.items() if w}
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)


def _hold_idle_connections(address: str, port: int, stop: threading.Event, count: int = 3) -> None:
    """A stranger: keeps `count` connections open to the port, sending nothing."""
    held: list[socket.socket] = []
    while not stop.is_set():
        held = [s for s in held if s.fileno() >= 0]
        while len(held) < count and not stop.is_set():
            try:
                held.append(socket.create_connection((address, port), timeout=0.5))
            except OSError:
                break
        time.sleep(0.05)
    for s in held:
        s.close()


def test_strangers_idle_on_the_master_port_cannot_fake_a_firewall(clean_lab):
    stop = threading.Event()
    stranger = threading.Thread(target=_hold_idle_connections,
                                args=(clean_lab.node("master").ipv4, 29500, stop), daemon=True)
    stranger.start()
    try:
        for _ in range(2):
            done = subprocess.run([*CLI, *NODES, "--ssh-config", str(clean_lab.ssh_config), "--json",
                                   "--only", "master-reachable,ephemeral-ports"],
                                  capture_output=True, text=True, timeout=120, cwd=REPO)
            report = json.loads(done.stdout)
            bad = [r for r in report["results"] if r["status"] != "pass"]
            assert done.returncode == 0 and not bad, bad
    finally:
        stop.set()
        stranger.join(5)


def test_a_200_mb_line_without_a_newline_costs_the_launcher_kilobytes(clean_lab, tmp_path):
    script = tmp_path / "long_line.py"
    script.write_text("import os, sys\n"
                      "if os.environ['RANK'] == '1':\n"
                      "    chunk = 'x' * (1 << 20)\n"
                      "    for _ in range(200):\n"
                      "        sys.stdout.write(chunk)\n"
                      "    sys.stdout.flush()\n"
                      "print('\\nafter the long line', flush=True)\n")
    argv = [*CLI, *NODES, "--ssh-config", str(clean_lab.ssh_config), "--launch", "--nproc-per-node", "1",
            "--no-probes", "--log-dir", str(tmp_path / "run"), "--", str(script)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    peak = [0]

    def watch_memory():
        while proc.poll() is None:
            try:
                status = Path(f"/proc/{proc.pid}/status").read_text()
                peak[0] = max(peak[0], int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]))
            except (OSError, StopIteration):
                pass
            time.sleep(0.05)
    threading.Thread(target=watch_memory, daemon=True).start()
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr[-3000:]
    assert b"[worker1 r1] after the long line" in stdout
    assert peak[0] < 400 * 1024, f"the launcher's resident memory reached {peak[0] // 1024} MiB"
    result = (tmp_path / "run" / "result.json").read_bytes()
    assert len(result) < 200_000 and len(stdout) < 1_000_000


def quiet_counts(lab) -> dict:
    """Each node's process count once the last test's ssh sessions have finished exiting."""
    last, deadline = counts(lab), time.monotonic() + 15
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = counts(lab)
        if now == last:
            return now
        last = now
    return last


def _in_use() -> set[str]:
    """The folders under /tmp that a live process holds (an open descriptor, its working folder)
    or names (its command line, its environment: torchrun's --log-dir, a rank's
    TORCHELASTIC_ERROR_FILE). The lab's nodes share this machine's /tmp with whatever else runs
    here (another lab of the suite's other worker): a folder still in use is someone's live run,
    not one this run left."""
    used: set[str] = set()
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        names: list[str] = []
        with contextlib.suppress(OSError):
            names.append(os.readlink(f"/proc/{pid}/cwd"))
        with contextlib.suppress(OSError):
            names += [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        for part in ("cmdline", "environ"):
            with contextlib.suppress(OSError):
                names += re.findall(r"/tmp/[^/\0=\s]+", Path(f"/proc/{pid}/{part}").read_bytes().decode("utf-8", "replace"))
        used.update(n.split("/")[2] for n in names if n.startswith("/tmp/") and n.count("/") >= 2)
    return used


def _leftovers() -> set[str]:
    """What a run could leave in /tmp (the lab's nodes share this machine's /tmp): the node
    programs' private folders, and the log folders the launch gives torchrun; none that a live
    process uses."""
    # Not torchrun's default torchelastic_* folders: a launch gives torchrun its own --log-dir
    # (ddp-preflight-torchrun-*), and torchruns started by hand in other tests (attach) make them.
    found = {p.name for p in Path("/tmp").iterdir()
             if p.name.startswith(("ddp-preflight-node-", "ddp-preflight-torchrun-"))
             and p.stat().st_uid == os.getuid()}
    return found - _in_use() if found else found


def test_a_stopped_run_leaves_no_folder_on_any_node(clean_lab, tmp_path):
    before_files, before = _leftovers(), quiet_counts(clean_lab)
    argv = command(clean_lab, tmp_path, "--no-probes", script_args=("--steps", "1000", "--step-time", "0.2"))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    for line in proc.stdout:
        if " step 1 loss" in line:
            break
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert_nothing_left(clean_lab, before)
    left = _leftovers() - before_files
    assert not left, left


def _ours_on(lab, node: str) -> list[int]:
    """The run's processes on a node: its training and ddp-preflight's node programs (not sshd)."""
    out = []
    for pid in lab.processes(node):
        try:
            line = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"train_ddp.py" in line or b"node.programs" in line or b"sys.stdin.buffer.read(int(" in line:
            out.append(pid)
    return out


def test_a_node_cut_off_from_its_master_stops_its_part_within_the_lease(clean_lab, tmp_path):
    """worker1's link goes down, then the master is stopped (Ctrl-C): no stop can reach worker1,
    and still nothing of the run is left there once the lease has run out."""
    before = quiet_counts(clean_lab)
    argv = command(clean_lab, tmp_path, "--no-probes", "--node-lease", "10",
                   script_args=("--steps", "1000", "--step-time", "0.2"))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    netns = clean_lab.node("worker1").netns
    try:
        for line in proc.stdout:
            if "[worker1 r3] step 1 loss" in line:
                break
        assert _ours_on(clean_lab, "worker1"), "nothing of the run on worker1"
        subprocess.run(["ip", "-n", netns, "link", "set", "eth0", "down"], check=True)
        cut = time.monotonic()
        proc.send_signal(signal.SIGINT)
        while _ours_on(clean_lab, "worker1") and time.monotonic() - cut < 30:
            time.sleep(0.2)
        gone_after = time.monotonic() - cut
        left = _ours_on(clean_lab, "worker1")
        assert not left, f"still on worker1 {gone_after:.0f} s after its link went down: {left}"
        assert gone_after < 10 + 8       # the lease, the supervisor's grace, a sample
        stdout, stderr = proc.communicate(timeout=90)
        assert "Traceback" not in stderr, stderr[-3000:]
        assert "worker1 did not confirm the stop" in stderr and "within its 10 s lease" in stderr, stderr[-2000:]
    finally:
        subprocess.run(["ip", "-n", netns, "link", "set", "eth0", "up"], check=True)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert_nothing_left(clean_lab, before, timeout=60)      # the sessions of the cut link end too
