"""A real 2-node x 2-rank torchrun job on the lab (examples/hang_train.py), and hangwatch
watching it over the lab's sshd, as a user would run them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "examples" / "hang_train.py"
NODES = ("master", "worker1")
STARTUP = 180        # seconds a 2x2 torchrun job may take to start training on a loaded box


def cmdline_of(pid: int) -> str:
    """The command line of a process, or "" if it ended between the listing and the read."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except FileNotFoundError:
        return ""


def wait_until(predicate, timeout: float, what: str):
    """predicate()'s first true value within `timeout` seconds, or TimeoutError(what)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.1)
    raise TimeoutError(what)


def went_first(diagnosis: dict, rank: int) -> str:
    """The reason for the rank the kernel's TIME_WAIT says went first, as its own end reads: its
    error is its own failure; torchrun's SIGTERM mid-teardown (or no end read) says only that it
    was leaving. Exits are typed in the JSON ({"code", "signal"}); a string compared here never
    matched, and the test expected "failed" whatever the run did."""
    [ended] = [e["exit"] for e in diagnosis["evidence"] if e["rank"] == rank]
    return "leaving" if ended is None or ended.get("signal") == signal.SIGTERM else "failed"


@dataclass
class Job:
    lab: object
    procs: list[subprocess.Popen]
    lines: list[tuple[str, str]] = field(default_factory=list)     # (node, line)
    mark: str = ""               # HANG_TRAIN_JOB=...: in the environment of everything the job starts

    def fault_time(self, timeout: float = STARTUP) -> float:
        """When the fault began, as the faulty rank printed it. The wait is the job's start-up (two
        torchruns, four ranks importing torch and a loader worker each): on a loaded 2-core box it
        took over 60 s; no verdict is timed from it, they are timed from the fault's own stamp."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for _, line in list(self.lines):
                m = re.search(r"FAULT \S+ rank \d+ step \d+ at ([\d.]+)", line)   # ranks share a pipe: lines can merge
                if m:
                    return float(m.group(1))
            if all(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.1)
        raise AssertionError(f"the fault never started (exit codes {[p.poll() for p in self.procs]}): "
                             f"{self.lines[-20:]}")

    def said(self) -> list[tuple[str, str]]:
        """What a failed job said that explains it: every traceback and error line its ranks
        printed, then its last lines (torchrun's summary alone names no cause)."""
        lines = list(self.lines)
        start = [i for i, (_, line) in enumerate(lines) if "Traceback" in line]
        cause = lines[start[0]:start[0] + 60] if start else \
            [x for x in lines if re.search(r"Error|error:|exception", x[1])][:40]
        return cause + [("...", "...")] + lines[-20:]

    def wait(self, timeout: float) -> list[int | None]:
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        return [p.poll() for p in self.procs]

    def stop(self) -> None:
        """torchrun puts each rank in its own session: SIGTERM torchrun, which stops its ranks;
        then whatever of the job is left in the nodes is killed."""
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        self.wait(10)
        for node in NODES:
            for pid in self.lab.processes(node):
                try:
                    # Its ranks, and what they started (loader workers, helpers), carry the job's mark.
                    mine = self.mark.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                    if mine or "hang_train.py" in Path(f"/proc/{pid}/cmdline").read_text():
                        os.kill(pid, signal.SIGKILL)          # a stopped rank too (SIGTERM waits for SIGCONT)
                except (FileNotFoundError, ProcessLookupError):
                    pass
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


def start_job(lab, *args: str, port: int, nproc: int = 2, nodes=NODES, script: Path = SCRIPT) -> Job:
    master = lab.node(nodes[0]).ipv4
    job = Job(lab, [], mark=f"HANG_TRAIN_JOB={port}")
    for i, node in enumerate(nodes):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(nodes)),
                "--nproc-per-node", str(nproc), "--node-rank", str(i), "--master-addr", master,
                "--master-port", str(port), str(script), *args]
        proc = lab.popen(node, ["env", "GLOO_SOCKET_IFNAME=eth0", "OMP_NUM_THREADS=1", job.mark, *argv],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        job.procs.append(proc)

        def read(node=node, proc=proc):
            for line in proc.stdout:
                job.lines.append((node, line.rstrip("\n")))
        threading.Thread(target=read, daemon=True).start()
    return job


@dataclass
class Watch:
    proc: subprocess.Popen
    events: list[dict] = field(default_factory=list)
    stderr: str = ""
    trace: str | None = None

    def wait_for(self, kind: str, timeout: float, where=lambda e: True) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in list(self.events):
                if e["event"] == kind and where(e):
                    return e
            time.sleep(0.1)
        # With every input the watcher had, timed: what CI's log must show to tell why.
        since = min((e["time"] for e in self.events), default=time.time() - timeout)
        raise AssertionError(f"no {kind} event in {timeout} s: {[e['event'] + ': ' + e['text'] for e in self.events]}\n"
                             + self.timeline(since))

    def timeline(self, since: float) -> str:
        """Every event so far, timed from `since`: what an assert on when a verdict came shows."""
        said = [f"{e['time'] - since:+7.2f} {e['event']}: {e['text']}" for e in list(self.events)]
        if self.trace and os.path.exists(self.trace):
            for line in Path(self.trace).read_text().splitlines():
                step = json.loads(line)
                if step["wall"] >= since - 10:
                    late = f" sent {step['wall'] - step['t']:.2f} s before" if step.get("t") else ""
                    said.append(f"{step['wall'] - since:+7.2f}   {step['input']} {step['node'] or ''} "
                                f"{step['message'] or ''}{late} -> {step['effects']}")
        return "\n".join(sorted(said, key=lambda line: float(line.split()[0]))) + "\n" + (self.stderr or "")[-3000:]

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["event"] == kind]

    def stop(self) -> int:
        try:
            return self._stop()
        finally:
            if self.trace:
                Path(self.trace).unlink(missing_ok=True)

    def _stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def hangwatch(lab, *args: str, hosts=NODES, user: list[str] = ()) -> Watch:
    # Its inputs, timed (hangwatch/watch.py's trace): what an assert on a verdict's time shows.
    trace = tempfile.NamedTemporaryFile(prefix="hangwatch-trace-", suffix=".jsonl", delete=False)
    trace.close()
    os.chmod(trace.name, 0o666)          # a watch run as another user writes it too
    proc = subprocess.Popen([*user, sys.executable, "-m", "ddp_preflight.hangwatch", "attach", *hosts, "--json",
                             "--ssh-config", str(lab.ssh_config), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).parents[2], env={**os.environ, "HANGWATCH_TRACE": trace.name})
    watch = Watch(proc, trace=trace.name)

    def read():
        for line in proc.stdout:
            watch.events.append(json.loads(line))
    threading.Thread(target=read, daemon=True).start()
    threading.Thread(target=lambda: setattr(watch, "stderr", proc.stderr.read()), daemon=True).start()
    return watch
