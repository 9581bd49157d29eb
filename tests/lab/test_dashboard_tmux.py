"""The dashboard end to end, as a user sees it: `ddp-preflight master worker1 --launch --tui` in a
real terminal (a private tmux server, read with capture-pane) over a real 2-node x 2-rank DDP
run on the lab. A rank leaves the loop at a known step: the screen names the deadlock, the rank
and its line; quitting with `q`, `y` stops every node and leaves nothing running. `q`, `n`
leaves the training running with its output as text, and Ctrl-C then stops it."""

from __future__ import annotations

import re
import secrets
import shlex
import subprocess
import sys
import time
from pathlib import Path

from tests.lab.test_launch_lab import NODES, assert_nothing_left, counts, left_since

REPO = Path(__file__).parents[2]
HANG = REPO / "examples" / "hang_train.py"
TRAIN = REPO / "examples" / "train_ddp.py"
GUILTY = 3
# The line the guilty rank sits on once it left the loop (hangwatch names it).
IDLE_LINE = next(i for i, text in enumerate(HANG.read_text().splitlines(), 1) if "time.sleep(3600)" in text)


class Terminal:
    """One command in a detached tmux session of a fixed size, on a tmux server of its own
    (`tmux -L NAME`): nothing is shared with the user's tmux. The command's exit code lands in
    a file; the pane stays open after it so the summary can be read."""

    def __init__(self, tmp_path: Path, width: int, height: int):
        self.socket = "ddpq-" + secrets.token_hex(4)
        self.rc_file = tmp_path / "exit-code"
        self.width, self.height = width, height
        self.socket_path: str | None = None

    def tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args],
                              capture_output=True, text=True, timeout=30, check=check)

    def start(self, argv: list[str], env: dict[str, str | None]) -> None:
        # On Ctrl-C bash waits for the launcher to finish its stop; the launcher handles SIGINT
        # and exits 1 (it does not die of it), so bash goes on and writes the exit code.
        settings = ([f"-u{k}" for k, v in env.items() if v is None]           # env takes options first
                    + [f"{k}={v}" for k, v in env.items() if v is not None])
        script = (f"env {' '.join(shlex.quote(s) for s in settings)} {shlex.join(argv)}; "
                  f"echo $? > {shlex.quote(str(self.rc_file))}; sleep 3600")
        self.tmux("new-session", "-d", "-x", str(self.width), "-y", str(self.height), "-c", str(REPO),
                  "bash", "-c", script)
        self.socket_path = self.tmux("display-message", "-p", "#{socket_path}").stdout.strip()

    def screen(self) -> str:
        """What the terminal shows now (the dashboard, on the alternate screen, while it is up)."""
        return self.tmux("capture-pane", "-p").stdout

    def scrollback(self) -> str:
        """The normal screen and its history: what was printed around the dashboard, with the
        lines the terminal wrapped joined again."""
        return self.tmux("capture-pane", "-p", "-J", "-S", "-2000").stdout

    def resize(self, width: int, height: int) -> None:
        """The terminal takes a new size, as a user's window does (the program gets SIGWINCH)."""
        self.tmux("resize-window", "-x", str(width), "-y", str(height))
        self.width, self.height = width, height

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", *keys)

    def wait_for(self, what: str, found, timeout: float, read=None) -> str:
        read = read or self.screen
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            if self.exit_code() is not None:
                raise AssertionError(f"the command ended (exit {self.exit_code()}) before {what}:\n{self.scrollback()}")
            text = read()
            if found(text):
                return text
            time.sleep(0.5)
        raise AssertionError(f"no {what} within {timeout:.0f} s; the terminal shows:\n{text}")

    def exit_code(self) -> int | None:
        try:
            return int(self.rc_file.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def wait_exit(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.exit_code() is None and time.monotonic() < deadline:
            time.sleep(0.25)
        code = self.exit_code()
        assert code is not None, f"the command did not end within {timeout:.0f} s:\n{self.scrollback()}"
        return code

    def kill(self) -> None:
        self.tmux("kill-server", check=False)
        if self.socket_path:                             # tmux leaves its socket file behind
            Path(self.socket_path).unlink(missing_ok=True)


def wind_down(lab, before: dict, timeout: float = 30) -> None:
    """After a failed test: the killed terminal hung up on the launcher, which stops its nodes;
    give that time so the next test starts from a quiet lab (its own checks stay strict)."""
    left_since(lab, before, timeout)


def settled_counts(lab, timeout: float = 10) -> dict:
    """The processes on each node before the run, once the last test's have finished ending."""
    deadline = time.monotonic() + timeout
    last = counts(lab)
    while time.monotonic() < deadline:
        time.sleep(1)
        now = counts(lab)
        if now == last:
            return now
        last = now
    return last


def launch_argv(lab, log_dir: Path, script: Path, *script_args: str) -> list[str]:
    return [sys.executable, "-m", "ddp_preflight", *NODES, "--ssh-config", str(lab.ssh_config), "--no-probes",
            "--nproc-per-node", "2", "--launch", "--tui", "--log-dir", str(log_dir), "--", str(script), *script_args]


def all_stepping(screen: str) -> bool:
    """Each rank's row counts its steps and their rate ("4.8/s", or "12.5s/step")."""
    return all(re.search(rf"^\s+{r}\s+(master|worker1)\s+\d+\s.*\s\d+ [\d.]+(/s|s/step)", screen, re.M)
               for r in range(4))


def guilty_row(screen: str) -> bool:
    return re.search(rf"^\s*!{GUILTY}\s+worker1\s+\d+", screen, re.M) is not None


def test_the_dashboard_names_a_deadlock_and_quitting_stops_every_node(clean_lab, tmp_path):
    # One live run, two terminal sizes: named on a 100x30 terminal, then the terminal shrinks to
    # 80x24 (tmux resizes the window; the dashboard gets SIGWINCH) and the narrow layout still names
    # it. NO_COLOR's rendering is pinned by the unit tests (test_tui_app.py): nothing is colour alone.
    before = settled_counts(clean_lab)
    logs = tmp_path / "run"
    term = Terminal(tmp_path, 100, 30)
    try:
        started = time.monotonic()
        term.start(launch_argv(clean_lab, logs, HANG, "--steps", "500", "--fault", "leave",
                               "--rank", str(GUILTY), "--at", "5"),
                   {"NO_COLOR": None, "COLUMNS": None, "LINES": None})
        named_after = None
        for width, height in ((100, 30), (80, 24)):
            if width != term.width:
                term.resize(width, height)
            screen = term.wait_for(f"deadlock naming rank 3 on the dashboard at {width}x{height}",
                                   lambda s: "DEADLOCK · for" in s and f"look at rank {GUILTY}" in s
                                   and guilty_row(s) and f"hang_train.py:{IDLE_LINE}" in s
                                   # the footer too: a screen read mid-redraw (after the resize) lacks it
                                   and "q quit" in s
                                   and max(map(len, s.splitlines()), default=0) <= term.width, timeout=90)
            named_after = named_after or time.monotonic() - started
            # The panel's summary and the guilty rank's own line, with its node and the line it sits on.
            assert re.search(rf"rank {GUILTY} left the loop", screen), screen
            if width >= 100:
                assert f"! rank {GUILTY} on worker1 at hang_train.py:{IDLE_LINE}" in screen, screen
            # Every rank has its row; only rank 3 carries the '!'.
            for rank, node in ((0, "master"), (1, "master"), (2, "worker1")):
                assert re.search(rf"^\s+{rank}\s+{node}\s+\d+", screen, re.M), screen
            assert re.findall(r"^\s*!(\d+)\s", screen, re.M) == [str(GUILTY)], screen
            row = next(line for line in screen.splitlines() if re.match(rf"^\s*!{GUILTY}\s", line))
            assert "idle" in row and f"hang_train.py:{IDLE_LINE}" in row, row
            assert "q quit" in screen
            assert len(screen.splitlines()) <= height, screen

        term.keys("q")
        term.wait_for("question on quit", lambda s: "Stop the training on every node?" in s
                      and "[y]es / [n]o" in s, timeout=10)
        term.keys("y")
        code = term.wait_exit(60)
        out = term.scrollback()
        assert code == 1, out
        assert "stopping every node: quit from the dashboard" in out, out
        assert "training stopped (quit from the dashboard): every node was stopped" in out, out
        for rank, node in ((0, "master"), (1, "master"), (2, "worker1"), (3, "worker1")):
            assert f"rank {rank} on {node}: signal 15 (SIGTERM), stopped by ddp-preflight" in out, out
        # No traceback of ddp-preflight's own. A rank's may be there: the nodes are stopped one by one,
        # and a rank whose peer was stopped first prints its lost peer ("[master r1] [rank1]: Traceback").
        assert "port 29500 on master is free again" in out, out
        assert [line for line in out.splitlines() if "Traceback" in line and not line.startswith("[")] == [], out

        assert f"FAULT leave rank {GUILTY} step 5" in (logs / "worker1.log").read_text()
        assert "[master r0] step 4 loss" in (logs / "master.log").read_text()
        assert list((logs / "incidents").glob("*deadlock*")), list((logs / "incidents").iterdir())
        # The launcher's own stop (q, y: SIGTERM to every rank) is a stop, not a failure to report.
        assert not list((logs / "incidents").glob("*exited*")), list((logs / "incidents").iterdir())
        assert_nothing_left(clean_lab, before)
        print(f"\ndeadlock on screen {named_after:.1f} s after the command started")
    finally:
        term.kill()
        wind_down(clean_lab, before)


def test_leaving_it_running_streams_the_output_and_ctrl_c_then_stops_every_node(clean_lab, tmp_path):
    before = settled_counts(clean_lab)
    logs = tmp_path / "run"
    term = Terminal(tmp_path, 100, 30)
    try:
        term.start(launch_argv(clean_lab, logs, TRAIN, "--steps", "1000", "--step-time", "0.2"),
                   {"COLUMNS": None, "LINES": None})
        term.wait_for("all 4 ranks stepping, no hang", lambda s: "no hang" in s and all_stepping(s), timeout=90)
        term.keys("q")
        term.wait_for("question on quit", lambda s: "Stop the training on every node?" in s, timeout=10)
        term.keys("n")
        out = term.wait_for("the training going on as text", lambda s: "the dashboard closed; the training goes on" in s
                            and re.search(r"^\[worker1 r3\] step \d+ loss", s.split("the training goes on")[-1], re.M),
                            timeout=20, read=term.scrollback)
        assert "Stop the training on every node?" not in term.screen()      # the dashboard is gone
        steps = [int(m) for m in re.findall(r"^\[worker1 r3\] step (\d+) loss", out, re.M)]
        later = term.wait_for("more steps", lambda s: max(map(int, re.findall(r"^\[worker1 r3\] step (\d+) loss", s, re.M)))
                              >= max(steps) + 3, timeout=20, read=term.scrollback)
        assert counts(clean_lab) != before          # still running on the nodes
        assert "stopping every node" not in later

        term.keys("C-c")
        code = term.wait_exit(60)
        out = term.scrollback()
        assert code == 1, out
        assert "stopping every node: interrupted (Ctrl-C)" in out and "Traceback" not in out, out
        for rank, node in ((0, "master"), (1, "master"), (2, "worker1"), (3, "worker1")):
            assert f"rank {rank} on {node}: signal 15 (SIGTERM), stopped by ddp-preflight" in out, out
        assert "port 29500 on master is free again" in out, out
        assert (logs / "master.log").exists() and (logs / "worker1.log").exists()
        assert_nothing_left(clean_lab, before)
    finally:
        term.kill()
        wind_down(clean_lab, before)


def test_the_terminal_closing_under_the_dashboard_stops_every_node_and_the_launcher_exits(clean_lab, tmp_path):
    # The terminal goes away (a closed window, a dropped ssh session: here tmux's server killed, which
    # hangs up on the launcher with SIGHUP) while the dashboard is up. Before: the launcher stopped
    # nothing and never exited, its dashboard's input thread reading the hung-up terminal at full CPU.
    before = settled_counts(clean_lab)
    logs = tmp_path / "run"
    term = Terminal(tmp_path, 100, 30)
    try:
        term.start(launch_argv(clean_lab, logs, TRAIN, "--steps", "1000", "--step-time", "0.2"),
                   {"COLUMNS": None, "LINES": None})
        term.wait_for("all 4 ranks stepping", all_stepping, timeout=90)
        found = subprocess.run(["pgrep", "-f", "--", f"--log-dir {logs} "], capture_output=True, text=True).stdout
        [launcher] = [int(p) for p in found.split()          # the launcher itself, not the shell that runs it
                      if Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[1:3] == [b"-m", b"ddp_preflight"]]
        term.kill()                                   # SIGHUP to the launcher
        deadline = time.monotonic() + 60
        while Path(f"/proc/{launcher}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not Path(f"/proc/{launcher}").exists(), \
            f"the launcher still runs 60 s after its terminal closed: {Path(f'/proc/{launcher}/stat').read_text()}"
        saved = (logs / "result.json").read_text()
        assert "the master's terminal closed (SIGHUP)" in saved, saved[:2000]
        assert_nothing_left(clean_lab, before)
    finally:
        term.kill()
        wind_down(clean_lab, before)
