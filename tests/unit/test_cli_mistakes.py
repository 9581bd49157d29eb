"""A newcomer's mistakes through the real commands (`python -m ddp_preflight`, `python -m ddp_preflight.hangwatch`
in a subprocess): each is one line that names what is wrong and what to do, an exit code that
says so, and never a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "ddp_preflight"]


def run(*args: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          env={**base, **kw.pop("env", {})}, **kw)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def one_line(done: subprocess.CompletedProcess, code: int = 2) -> str:
    assert (done.returncode, done.stdout) == (code, ""), (done.returncode, done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1, done.stderr
    return done.stderr.strip()


def reading_stdin(pid: int) -> bool:
    """The kernel's word: the process waits for stdin (/proc/PID/syscall: number, then the first argument)."""
    try:
        fields = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError:
        return False
    # read(0, ...), or the wait for stdin's next bytes under explain's time bound (select, pselect6,
    # poll, ppoll: x86_64's numbers), the only waits explain - has.
    return len(fields) > 1 and (fields[0] == "0" and int(fields[1], 16) == 0 or fields[0] in ("7", "23", "270", "271"))


def test_ctrl_c_while_explain_reads_stdin_is_one_line_and_exit_130():
    # Ctrl-C as a terminal sends it. A run started in the background by a shell without job control
    # (nohup make test &) ignores SIGINT, its children inherit that, and Python then installs no
    # handler of its own: explain read on to its end and exited 0. Its child starts as a terminal's.
    proc = subprocess.Popen([*CLI, "explain", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdin is not None
        proc.stdin.write("[worker1 r1] step 1 loss 3.2\n" * 1000)
        proc.stdin.flush()
        deadline = time.monotonic() + 30
        while not reading_stdin(proc.pid):
            assert time.monotonic() < deadline, "explain never read its stdin"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, out) == (130, "")
    assert err == "ddp-preflight explain: interrupted (Ctrl-C) before the explanation: nothing was said\n"


def test_explain_of_a_binary_file_is_unreadable_input(tmp_path):
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)) * 64)

    line = one_line(run("explain", str(binary)))

    assert line == (f"ddp-preflight explain: error: {binary} is a binary file, not a log: give a run's log folder, "
                    "a log file, an error file, a Flight Recorder dump or an incident bundle")


def test_a_binary_file_inside_a_folder_is_a_note_not_an_error(tmp_path):
    (tmp_path / "model.bin").write_bytes(bytes(range(256)) * 64)
    # With a log beside it: a folder holding nothing but binaries is unreadable input (test_newcomer_mistakes.py)
    (tmp_path / "train.log").write_text("[worker1 r1] step 1 loss 3.2\n")

    done = run("explain", str(tmp_path))

    assert done.returncode == 0, done.stderr
    assert f"not read: {tmp_path}/model.bin: binary" in done.stdout


def test_scan_of_a_path_that_is_not_there_is_a_usage_error():
    line = one_line(run("--scan", "/no/such/path", "--no-probes"))

    assert line == ("ddp-preflight: error: --scan /no/such/path: no such file or folder on this machine: give the "
                    "training code's folder or .py file as this machine sees it")


def test_lab_exec_not_as_root_is_one_line_with_the_fix():
    # The modules are imported as root (this Python lives under /root), then the process becomes nobody.
    program = ("import os, sys; import ddp_preflight.cli.lab; from ddp_preflight.cli.ddp_preflight import main; "
               "os.setgroups([]); os.setgid(65534); os.setuid(65534); "
               "sys.exit(main(['lab', 'exec', 'master', '--', 'true']))")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, cwd=ROOT, timeout=60)

    assert "Traceback" not in done.stderr, done.stderr
    assert one_line(done) == ("ddp-preflight lab: error: lab exec enters node master's network namespace, which only "
                              f"root may do: run it as root (sudo {sys.executable} -m ddp_preflight lab exec master -- CMD)")


# --- a --python too old for the node programs ------------------------------------------------------

def test_a_python_older_than_3_8_says_its_version_and_the_one_needed():
    from ddp_preflight.transport.errors import explain_python
    # What node/boot.py says first on a Python before 3.8 (it parses on 3.4 and up).
    why = explain_python("worker1", "/usr/bin/python3.6", 126, "DDP_PREFLIGHT_PYTHON too-old 3.6.15\n", ran=False)

    assert why.summary == "worker1: /usr/bin/python3.6 is Python 3.6.15, too old: ddp-preflight needs Python 3.8 " \
                          "or newer on the nodes"
    assert why.fix == ("give a Python 3.8+ environment on worker1: --python worker1:PATH, or python under [nodes.worker1] "
                       "in the config")


def test_python_2_is_named_by_its_missing_option():
    from ddp_preflight.transport.errors import explain_python
    # CPython 2.7's Modules/main.c and Python/getopt.c: the option it lacks, then its usage, exit 2.
    stderr = ("Unknown option: -I\nusage: /usr/bin/python2.7 [option] ... [-c cmd | -m mod | file | -] [arg] ...\n"
              "Try `python -h' for more information.\n")
    why = explain_python("worker1", "/usr/bin/python2.7", 2, stderr, ran=False)

    assert why.summary == "worker1: /usr/bin/python2.7 is Python 2 (or 3 before 3.4), too old: ddp-preflight needs " \
                          "Python 3.8 or newer on the nodes"


def test_the_boot_program_says_too_old_before_anything_else():
    import ast
    # The check must be reachable on the old Python: node/boot.py parses as 3.4's grammar.
    source = (ROOT / "ddp_preflight" / "node" / "boot.py").read_text()
    ast.parse(source, feature_version=(3, 4))
    assert "sys.version_info < (3, 8)" in source.split("def main():", 1)[1].split("try:", 1)[0]


# --- a training script that its Python cannot compile -----------------------------------------------

def test_a_training_script_with_a_syntax_error_fails_preflight_with_its_file_and_line(tmp_path):
    (tmp_path / "train.py").write_text("import torch\nimport model\n")
    (tmp_path / "model.py").write_text("import os\n\ndef forward(x)\n    return x\n")     # the colon forgotten
    done = subprocess.run([sys.executable, "-m", "ddp_preflight", "--only", "training-imports", "--python",
                           sys.executable, "--json", "--", "train.py"], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)

    assert done.returncode == 1, done.stderr
    (result,) = __import__("json").loads(done.stdout)["results"]
    node = result["node"]
    assert (result["status"], result["summary"], result["fix"]) == (
        "fail", f"{node}: {sys.executable} cannot compile model.py:3: expected ':': the training would stop there "
                "before its first step", "fix the syntax at model.py:3")


# --- the conventions of the tools users know ---------------------------------------------------------

def on_a_terminal(*args: str, columns: int = 100) -> tuple[int, str]:
    """The command on a real pseudo-terminal (stdout and stderr both), as a person sees it."""
    import fcntl
    import pty
    import struct
    import termios
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, columns, 0, 0))
    base = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS", "LINES")}
    proc = subprocess.Popen([*CLI, *args], stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, cwd=ROOT, env=base)
    os.close(slave)
    seen = b""
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:            # EIO: the child's end is closed
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(master)
        code = proc.wait(timeout=60)
    return code, seen.decode(errors="replace")


def test_preflight_says_at_once_what_it_is_doing_while_it_waits():
    code, seen = on_a_terminal("--only", "python-parity")

    assert code == 0, seen
    progress, report = seen.split("\x1b[?25h", 1)       # rich's live display ends by showing the cursor again
    assert "checking this machine (" in progress and ") alone (no HOST given)" in progress
    assert "\x1b[1;32mOK\x1b[0m: 1 passed, 0 warnings, 0 failed, 0 errors, 0 skipped on 1 node(s)" in report


def test_quiet_and_no_color():
    code, seen = on_a_terminal("--only", "python-parity", "-q", "--no-color")
    assert (code, seen) == (0, "OK: 1 passed, 0 warnings, 0 failed, 0 errors, 0 skipped on 1 node(s)\r\n")

    code, seen = on_a_terminal("--only", "python-parity", "-q")
    assert seen.startswith("\x1b[1;32mOK\x1b[0m: 1 passed")


def test_version_and_the_json_report_says_it():
    from importlib.metadata import version
    assert run("--version").stdout == f"ddp-preflight {version('ddp-preflight')}\n"
    done = subprocess.run([sys.executable, "-m", "ddp_preflight.hangwatch", "--version"], capture_output=True, text=True, cwd=ROOT)  # noqa: E501
    assert done.stdout == f"hangwatch (ddp-preflight) {version('ddp-preflight')}\n"

    report = __import__("json").loads(run("--only", "python-parity", "--json").stdout)
    assert report["version"] == version("ddp-preflight")


def test_torchruns_underscore_spellings_are_the_same_options():
    assert one_line(run("--nproc_per_node", "0")) == ("ddp-preflight: error: --nproc-per-node is 0: every node runs "
                                                      "at least one process, give 1 or more")
    assert one_line(run("--master_port", "70000")) == "ddp-preflight: error: --master-port 70000 is not a port number"


def test_a_node_not_reached_is_said_in_one_line_before_the_table(tmp_path):
    import socket
    with socket.socket() as s:             # a port nothing listens on once this is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "ssh_config"
    config.write_text(f"Host deadnode\n  HostName 127.0.0.1\n  Port {port}\n")

    done = run("deadnode", "--no-probes", "--ssh-config", str(config))

    assert done.returncode == 1
    first, second = done.stdout.splitlines()[:2]
    assert first == "NOT CHECKED: deadnode: nothing accepts ssh connections (connection refused) (fix 1 below)"
    assert second.startswith("┏")


def test_a_reader_that_goes_away_is_no_error():
    # `ddp-preflight --json | head -1`: the reader is gone before the report is written.
    proc = subprocess.Popen([*CLI, "--only", "python-parity", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    assert (proc.wait(timeout=60), err) == (141, b"")


def test_only_never_hides_a_node_that_was_not_reached():
    done = run("--python", "/no/such/python", "--only", "python-parity", "-q")

    assert done.returncode == 1, done.stdout           # was "OK: 0 passed ..." and exit 0
    first = done.stdout.splitlines()[0]
    assert first.startswith("NOT CHECKED: ") and first.endswith(": the training Python /no/such/python does not "
                                                                "exist there (fix 1 below)")


def test_a_mistyped_option_is_one_line_with_where_the_help_is():
    assert one_line(run("--master-port", "abc")) == ("ddp-preflight: error: argument --master-port/--master_port: "
                                                     "invalid int value: 'abc' (see ddp-preflight --help)")
    assert one_line(run("lab", "bogus")).startswith("ddp-preflight lab: error: argument COMMAND: invalid choice: "
                                                     "'bogus'")
    assert one_line(run("explain")) == ("ddp-preflight explain: error: the following arguments are required: PATH "
                                        "(see ddp-preflight explain --help)")


def test_a_junit_file_in_a_folder_that_is_not_there_is_said_before_any_node_is_contacted():
    line = one_line(run("--only", "python-parity", "--junit", "/no/such/dir/report.xml"))

    assert line == ("ddp-preflight: error: --junit /no/such/dir/report.xml: the folder /no/such/dir does not exist: "
                    "create it or give a file in an existing folder")


def test_bash_completion_comes_from_the_commands_own_tables(tmp_path):
    script = tmp_path / "completion.sh"
    script.write_text(run("--completion", "bash").stdout)

    def complete(line: str) -> list[str]:
        program = ('source "$0"; read -ra COMP_WORDS <<< "$1"; [[ $1 == *" " ]] && COMP_WORDS+=(""); '
                   'COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _ddp_preflight; printf "%s\\n" "${COMPREPLY[@]}"')
        done = subprocess.run(["bash", "-c", program, str(script), line], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert complete("ddp-preflight --only node-r") == ["node-reachable"]
    assert complete("ddp-preflight --only ptrace,clock") == ["ptrace,clock-skew"]
    assert complete("ddp-preflight --nproc") == ["--nproc-per-node", "--nproc_per_node"]
    assert complete("ddp-preflight lab f") == ["fault", "faults"]
    assert complete("ddp-preflight lab fault add fire") == ["firewall@", "firewall-part@", "firewall-self@"]
