"""Issue 23, attack 7: escape sequences a rank or another user puts in a file name, a function name,
an exception's message, a Flight Recorder op name or a process's command line reach no terminal
raw, through any renderer: preflight's table and its JUnit file, `explain`, `hangwatch attach`'s
lines, the launcher's hangwatch lines and its "training failed" summary, a rank's output line,
report.txt and the dashboard. Each is written out (ESC as ^[, BEL as ^G, the C1 CSI 0x9b as M-^[,
a carriage return as ^M), never obeyed.

The hostile strings come from real places: a process of the second user (tests/hostile.py) that
holds the master port under an escape-laden name; a real traceback and torchelastic error file of
a script that user ran (its function and file named with escapes); the recorded agent messages of
real lab runs (tests/unit/artifacts/agent/) whose frames, rank endings and Flight Recorder dumps
carry them."""

from __future__ import annotations

import asyncio
import copy
import io
import json
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.hostile import hostile_user

from .ports import free_port

ROOT = Path(__file__).parents[2]
ART = Path(__file__).parent / "artifacts"
SYSTEM_PYTHON = "/usr/bin/python3"     # the second user cannot run this checkout's venv (root's pyenv)

# A window title set (OSC ... BEL), a clear screen and cursor home (CSI), a CSI as the one C1 byte 0x9b.
EVIL = "\x1b]0;pwned\x07\x1b[2J\x1b[H\x9b31m"
EVIL_SHOWN = "^[]0;pwned^G^[[2J^[[HM-^[31m"
# The same, then a carriage return that would put a forged text over the line's start.
FORGE = EVIL + "\rFORGED"
FORGE_SHOWN = EVIL_SHOWN + "^MFORGED"
RAW_TEXT = ("\x1b", "\x07", "\x9b", "\r")
RAW_BYTES = (b"\x1b", b"\x07", b"\xc2\x9b", b"\r")       # 0x9b as a terminal receives it in UTF-8


def assert_clean(output, where: str) -> None:
    """No byte a terminal would obey: ESC, BEL, C1 CSI or a carriage return."""
    for raw in (RAW_BYTES if isinstance(output, bytes) else RAW_TEXT):
        assert raw not in output, (where, raw, output[-3000:])


@pytest.fixture
def intruders_folder():
    """A folder of the second user's, in its home (root's tmp_path is closed to it); removed after."""
    user = hostile_user()
    path = user.folder(user.home / f"hostile-text-{secrets.token_hex(4)}", 0o755)
    yield user, path
    shutil.rmtree(path, ignore_errors=True)


def cli(*args: str, stdin: bytes | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddp_preflight.cli.ddp_preflight", *args], capture_output=True, cwd=ROOT,
                          input=stdin, timeout=timeout)


# -- preflight: another user's process holds the master port -------------------------------------

LISTEN = ("import socket, sys, time\n"
          "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
          "s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen(); time.sleep(300)\n")


def wait_listening(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"the second user's listener never took port {port}")


def test_another_users_process_on_the_master_port_cannot_drive_preflights_report(tmp_path):
    # Its name (argv[0], which master-port quotes in its summary and its fix) carries rich markup
    # too: the table shows "[red]" as it is rather than eating it as a style.
    user = hostile_user()
    port = free_port()
    name = "[red]" + FORGE
    listener = user.popen([name, "-c", LISTEN, str(port)], executable=SYSTEM_PYTHON,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port)
        junit = tmp_path / "report.xml"
        done = cli("--only", "master-port", "--master-port", str(port), "--junit", str(junit))
    finally:
        listener.kill()
        listener.wait()
    assert done.returncode == 1, (done.stdout[-2000:], done.stderr[-2000:])
    assert_clean(done.stdout, "preflight's table")
    assert_clean(done.stderr, "preflight's stderr")
    lines = done.stdout.decode().splitlines()
    other = 29501 if port == 29500 else 29500
    shown = "[red]" + FORGE_SHOWN
    # (The fix names the program by its first word: what comes before the \r.)
    assert f"  1. --master-port {other}   # another port for the run; {port} is [red]{EVIL_SHOWN}'s, leave it running" \
        in lines
    # The summary column, its folded lines joined: the holder named as written out.
    summary = " ".join(line.split("│")[5].strip() for line in lines if line.count("│") == 6)
    assert f"is held by PID {listener.pid} ({shown} -c " in summary, summary
    # The JUnit file is XML a CI can read (1.0 cannot hold ESC at all), its text written out too.
    document = junit.read_bytes()
    assert_clean(document, "the JUnit file")
    failure = ET.fromstring(document).find("testsuite/testcase/failure")
    assert failure is not None and f"({shown} -c " in failure.get("message", "")


# -- explain: a rank's traceback, error file and Flight Recorder dumps -------------------------

RAISES = """import sys
EVIL = sys.argv[1]
def step(n):
    raise RuntimeError("bad shard" + EVIL)
step.__code__ = step.__code__.replace(co_name="step" + EVIL)
step(7)
"""


def test_a_ranks_traceback_and_error_file_cannot_drive_explain(intruders_folder):
    # The second user's script, run as a launched rank runs (node/rank_bootstrap.py): its file and
    # function are named with escapes and its exception's message carries them. Its output (the
    # traceback Python printed) and the torchelastic error file are what explain reads. (No \r here:
    # a log's reader splits lines at it, so it could never reach a message whole.)
    user, folder = intruders_folder
    script = user.file(folder / f"train{EVIL}.py", RAISES)
    bootstrap = ROOT / "ddp_preflight" / "node" / "rank_bootstrap.py"
    ran = user.run(["sh", "-c", '"$@" 2> rank5.log', "sh", SYSTEM_PYTHON, str(bootstrap), str(script), EVIL],
                   check=False, cwd=str(folder),
                   env={**user.env(), "TORCHELASTIC_ERROR_FILE": str(folder / "error-rank-5.json")})
    assert ran.returncode == 1 and EVIL.encode() in (folder / "rank5.log").read_bytes()
    done = cli("explain", str(folder))
    assert done.returncode == 1, done.stderr
    assert_clean(done.stdout, "explain's text")
    assert_clean(done.stderr, "explain's stderr")
    lines = done.stdout.decode().splitlines()
    assert f"  {folder}/error-rank-5.json: RuntimeError: bad shard{EVIL_SHOWN}" in lines, lines
    assert (f'  {folder}/rank5.log:4: File "{folder}/train{EVIL_SHOWN}.py", line 4, in step{EVIL_SHOWN}'
            in lines), lines
    # --json keeps the values as they were: JSON escapes them.
    as_json = cli("explain", str(folder), "--json")
    assert_clean(as_json.stdout, "explain --json")
    quotes = json.loads(as_json.stdout)["quotes"]
    assert any(q["text"] == f"RuntimeError: bad shard{EVIL}" for q in quotes), quotes


def test_flight_recorder_op_names_cannot_drive_explain(intruders_folder):
    # The four dumps of a real launch whose rank 2 left the loop, as the second user could leave
    # them: every all_reduce's name carries escapes.
    user, folder = intruders_folder
    for path in sorted((ART / "explain" / "launch-leave").glob("flight-rank-*.json")):
        dump = json.loads(path.read_text())
        for entry in dump["flight"]["entries"]:
            entry["profiling_name"] = entry["profiling_name"].replace("all_reduce", "all_reduce" + FORGE)
        user.file(folder / path.name, json.dumps(dump))
    done = cli("explain", str(folder))
    assert done.returncode == 1, done.stderr
    assert_clean(done.stdout, "explain's text")
    op = "all_reduce" + FORGE_SHOWN
    assert done.stdout.decode().splitlines()[0] == \
        f"deadlock (certain): rank 2 never entered {op} #12 (its last: #11 {op}), which ranks 0,1,3 issued"


# -- hangwatch: recorded agent messages whose frames carry escapes --------------------------------

def hostile_recording(name: str, ending: dict | None = None) -> list[str]:
    """A recording of tests/unit/artifacts/agent/ as the second user's ranks could have made it: the
    training script's file and its `main` named with escapes (py-spy reads both from the rank), and
    the raising rank's own record of its end (`ending`) given to its exit."""
    lines = (ART / "agent" / f"{name}.jsonl").read_text().splitlines()
    header = json.loads(lines[0])

    def rename(value):
        if isinstance(value, dict):
            out = {k: rename(v) for k, v in value.items()}
            if "hang_train" in str(value.get("filename", "")) and value.get("name") == "main":
                out["name"] = "main" + FORGE
            return out
        if isinstance(value, list):
            return [rename(v) for v in value]
        if isinstance(value, str):
            return value.replace("hang_train.py", f"hang{FORGE}.py")
        return value

    records = [rename(json.loads(line)) for line in lines[1:]]
    if ending is not None:
        pid = next(r["msg"]["pid"] for r in records
                   if r["msg"]["type"] == "rank" and r["msg"]["rank"] == header["rank"])
        for r in records:
            if r["msg"]["type"] == "exit" and r["msg"]["pid"] == pid:
                r["msg"]["ending"] = {**ending, "pid": pid, "t": r["msg"]["t"]}
    return [json.dumps(header)] + [json.dumps(r) for r in records]


def replay(lines: list[str], tmp_path: Path):
    """The recording through a real Watcher on a driven clock (as tests/unit/test_hangwatch_watch.py)."""
    from ddp_preflight.hangwatch.watch import Watcher, WatchTarget
    from ddp_preflight.transport import LocalNode

    records = [json.loads(line) for line in lines[1:]]
    hello = next(r for r in records if r["msg"].get("type") == "hello")
    began = hello["msg"]["time"] - hello["at"]
    now = [0.0]
    events: list = []
    watcher = Watcher([WatchTarget(LocalNode("master", "python")), WatchTarget(LocalNode("worker1", "python"))],
                      clock=lambda: now[0], wall=lambda: began + now[0], on_event=events.append,
                      incident_dir=str(tmp_path / "incidents"))
    for record in records:
        while now[0] + 0.25 <= record["at"]:
            now[0] += 0.25
            watcher.tick()
        now[0] = record["at"]
        watcher.receive(record["node"], record["msg"])
    for _ in range(80):                   # the verdict on how the ranks ended waits a moment for late exits
        now[0] += 0.25
        watcher.tick()
    return watcher, events


LEFT_LOOP = f"rank 3 left the loop: idle at hang{FORGE_SHOWN}.py:149 (main{FORGE_SHOWN}); ranks 0,1,2 wait in all_reduce"


@pytest.fixture(scope="module")
def deadlock(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("deadlock")
    watcher, events = replay(hostile_recording("leave"), tmp_path)
    found = [e for e in events if e.kind == "diagnosis"]
    assert found, [e.text for e in events]
    return found[0], tmp_path


def test_attachs_lines_show_a_ranks_escapes_never_obey_them(deadlock):
    from ddp_preflight.hangwatch.render import diagnosis_block, event_line

    event, _ = deadlock
    line = event_line(event.kind, event.text, at=0)
    assert_clean(line, "attach's event line")
    assert line == time.strftime("%H:%M:%S", time.localtime(0)) + f" diagnosis  DEADLOCK: {LEFT_LOOP}"
    block = diagnosis_block(event.snapshot)
    assert_clean(block, "attach's diagnosis block")
    lines = block.splitlines()
    assert lines[0] == f"DEADLOCK: {LEFT_LOOP}"
    rank3 = next(line for line in lines if line.startswith("  rank 3 "))
    assert f" idle at hang{FORGE_SHOWN}.py:149 (main{FORGE_SHOWN}); CPU " in rank3, rank3


def test_the_launchers_hangwatch_line_shows_them_too(deadlock, capsys):
    from ddp_preflight.cli.launch import say

    event, _ = deadlock
    say(f"hangwatch: {event.text}")
    assert capsys.readouterr().err == f"ddp-preflight: hangwatch: DEADLOCK: {LEFT_LOOP}\n"


def test_the_bundles_report_shows_them_too(deadlock):
    _, tmp_path = deadlock
    reports = sorted((tmp_path / "incidents").glob("*/report.txt"))
    assert reports, "no bundle was written"
    report = reports[0].read_bytes()
    assert_clean(report, "report.txt")
    lines = report.decode().splitlines()
    assert f"DEADLOCK: {LEFT_LOOP}" in lines
    assert f"    hang{FORGE_SHOWN}.py:149 main{FORGE_SHOWN}" in lines, [line for line in lines if "hang" in line]
    # incident.json keeps the rank's words as they were (JSON escapes them).
    document = json.loads((reports[0].parent / "incident.json").read_text())
    assert document["snapshot"]["diagnosis"]["evidence"][3]["function"] == "main" + FORGE


def test_the_dashboard_shows_them_written_out(deadlock):
    from rich.console import Console
    from textual.widgets import Static

    from ddp_preflight.tui.app import DashboardApp
    from ddp_preflight.tui.replay import ReplaySource
    from ddp_preflight.tui.screens import LogScreen, StackScreen, StacksScreen

    event, _ = deadlock
    snapshot = copy.deepcopy(event.snapshot)
    snapshot.messages.append(f"worker1: {FORGE}")
    logs = {(r.node, r.rank): [f"step 5{FORGE}", f"loss 2.0{EVIL}"] for r in snapshot.ranks}

    def screen(app) -> str:
        console = Console(width=app.size.width, file=io.StringIO(), record=True, color_system=None)
        console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
        return console.export_text()

    async def scenario():
        app = DashboardApp(ReplaySource([snapshot], logs=logs), refresh=60)
        seen = {}
        async with app.run_test(size=(200, 50)) as pilot:
            for _ in range(500):
                if app.applied:
                    break
                await pilot.pause(0.01)
            await pilot.pause()
            seen["main"], seen["svg"] = screen(app), app.export_screenshot()
            await pilot.press("s")                      # the guilty rank's stack
            assert isinstance(app.screen, StackScreen)
            seen["stack"] = str(app.screen.query_one("#stack", Static).render())
            seen["stack screen"] = screen(app)
            await pilot.press("escape", "g")
            assert isinstance(app.screen, StacksScreen)
            seen["stacks"] = screen(app)
            await pilot.press("escape", "l")
            assert isinstance(app.screen, LogScreen)
            for _ in range(500):
                if "reading" not in str(app.screen.query_one("#log", Static).render()):
                    break
                await pilot.pause(0.01)
            seen["log"] = str(app.screen.query_one("#log", Static).render())
            seen["log screen"] = screen(app)
        return seen

    seen = asyncio.run(scenario())
    for where, text in seen.items():
        assert_clean(text, f"the dashboard: {where}")
    main = seen["main"]
    assert LEFT_LOOP[:60] in main and f"worker1: {FORGE_SHOWN}" in main, main
    assert f"hang{FORGE_SHOWN}.py:149" in main                    # the ranks table's frame column
    assert f"hang{FORGE_SHOWN}.py:149  main{FORGE_SHOWN}" in seen["stack"].splitlines()
    assert f"    hang{FORGE_SHOWN}.py:145  main{FORGE_SHOWN}" in seen["stacks"]         # ranks 0-2's stacks
    # A rank's output line: a carriage return keeps what a terminal would have shown of it.
    assert seen["log"].splitlines() == ["FORGED", f"loss 2.0{EVIL_SHOWN}"]


# -- how the ranks ended: the launcher's summary ---------------------------------------------------

def recorded_ending(user, folder: Path) -> dict:
    """The raising rank's own record of its end (node/rank_bootstrap.py's PID.end), made by the
    second user's script: its message and function carry escapes and a carriage return."""
    script = user.file(folder / "train.py", RAISES)
    records = user.folder(folder / "records", 0o755)
    ran = user.run([SYSTEM_PYTHON, str(ROOT / "ddp_preflight" / "node" / "rank_bootstrap.py"), str(script), FORGE], check=False,
                   cwd=str(folder), env={**user.env(), "DDP_PREFLIGHT_FLIGHT_RECORDER": str(records)})
    assert ran.returncode == 1, ran.stderr
    found = list(records.glob("*.end"))
    assert found, "the bootstrap recorded no ending"
    return json.loads(found[0].read_text())


def test_the_training_failed_summary_shows_a_ranks_exception_written_out(intruders_folder, tmp_path):
    from ddp_preflight.launch.outcome import LaunchedRank, LaunchResult, NodeState, Why, render

    user, folder = intruders_folder
    ending = recorded_ending(user, folder)
    assert ending["message"] == "bad shard" + FORGE and ending["frames"][-1]["function"] == "step" + FORGE
    watcher, events = replay(hostile_recording("raise", ending), tmp_path)
    verdict = watcher.verdict()
    assert verdict is not None and verdict.named == (1,), [e.text for e in events]
    result = LaunchResult(
        ranks=[LaunchedRank(0, "master", 0, exit=None, signal=15, why=Why.STOPPED_BY_TORCHRUN, stopped_for=(1,)),
               LaunchedRank(1, "master", 1, exit=1),
               LaunchedRank(2, "worker1", 0, exit=None, signal=15, why=Why.STOPPED_BY_US),
               LaunchedRank(3, "worker1", 1, exit=None, signal=15, why=Why.STOPPED_BY_US)],
        nodes=[NodeState("master", "failed", exit=1, error=f"torchrun said {FORGE}"),
               NodeState("worker1", "stopped", stopped=True)],
        stop_reason="rank 1 failed", first_failure="master", seconds=14.0, verdict=verdict)
    summary = render(result, 29500, "master")
    assert_clean(summary, "the summary")
    lines = summary.splitlines()
    # (The headline quotes the message's first line: what comes before the \r.)
    assert lines[0] == (f"training failed: rank 1 on master raised RuntimeError: bad shard{EVIL_SHOWN} "
                        f"at train.py:4; every node was stopped"), lines[0]
    assert f"  master: torchrun said {FORGE_SHOWN}" in lines


# -- a rank's output line ---------------------------------------------------------------------------

def test_a_ranks_carriage_return_cannot_take_the_launchers_prefix_off_its_line():
    from ddp_preflight.launch.output import Line

    # Rank 1 tries to pass its line off as rank 0's (or as the launcher's own).
    line = Line("master", 1, 1, f"loss 2.0\r[master r0] step 9{EVIL}", 0.0)
    assert line.shown() == f"[master r1] [master r0] step 9{EVIL_SHOWN}"
    assert Line("master", None, None, "\r\x1b[2Jddp-preflight: training finished", 0.0).shown() == \
        "[master] ^[[2Jddp-preflight: training finished"


def test_the_sanitizer_writes_out_what_a_terminal_would_obey():
    from ddp_preflight.node.terminal import shown, shown_data, shown_text, visible

    assert shown(FORGE + "\n\x00\x7f\tend") == FORGE_SHOWN + "^J^@^?\tend"
    assert shown("a\u202eb\u2028c") == "a<U+202E>b<U+2028>c"          # bidi override, line separator
    assert shown_text(f"one{EVIL}\ntwo\r") == f"one{EVIL_SHOWN}\ntwo^M"
    assert visible(f" 10%\r 20%{EVIL}\r") == f" 20%{EVIL_SHOWN}"
    plain = {"a": ["x", ("y", 1)]}
    assert shown_data(plain) is plain                                     # nothing to write out: not copied
    assert shown_data({"k" + EVIL: [FORGE, 3]}) == {"k" + EVIL_SHOWN: [FORGE_SHOWN, 3]}


def test_no_renderer_emits_a_raw_control_character_from_a_recorded_snapshot(tmp_path):
    # Every string of a recorded snapshot made hostile: each renderer's text stays clean.
    from ddp_preflight.hangwatch.incident import write
    from ddp_preflight.hangwatch.model import Snapshot
    from ddp_preflight.hangwatch.render import diagnosis_block, incident_report, rank_line
    from ddp_preflight.tui.widgets.cluster import render_cluster
    from ddp_preflight.tui.widgets.diagnosis import render_diagnosis
    from ddp_preflight.tui.widgets.preflight import render_result
    from ddp_preflight.tui.widgets.ranks import cells

    def hostile(value):
        if isinstance(value, dict):
            return {k: hostile(v) for k, v in value.items()}
        if isinstance(value, list):
            return [hostile(v) for v in value]
        if isinstance(value, str) and not re.fullmatch(r"[a-z-]+", value):    # an enum's word stays
            return value + FORGE
        return value

    data = json.loads((ART / "snapshots" / "deadlock.json").read_text())
    snapshot = Snapshot.from_json({**hostile(data), "diagnosis": {**hostile(data["diagnosis"]),
                                                                  "kind": "deadlock", "reason": "left-loop"}})
    result = {"check": "master-port", "node": "master" + FORGE, "status": "fail", "summary": "held by " + FORGE,
              "fix": "kill " + FORGE, "details": {"cmdline": ["python", FORGE]}}
    texts = {"diagnosis_block": diagnosis_block(snapshot), "report": incident_report(snapshot, {}),
             "rank lines": "\n".join(rank_line(r) for r in snapshot.ranks),
             "cluster": render_cluster(snapshot).plain, "diagnosis panel": render_diagnosis(snapshot).plain,
             "preflight detail": render_result(result).plain,
             "ranks table": "\n".join(cell for r in snapshot.ranks for cell, _ in cells(r, False))}
    bundle = Path(write(snapshot, {}, str(tmp_path / "incidents")))
    texts["report.txt"] = (bundle / "report.txt").read_text()
    for where, text in texts.items():
        assert_clean(text, where)
        assert FORGE_SHOWN in text, where


# -- attack 11: secrets the name rules missed are hidden wherever they are shown or written ---------

def secret_values() -> dict[str, str]:
    """One fresh value of each shape: the test greps for these exact strings."""
    def alnum(n: int) -> str:
        return "".join(secrets.choice("ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789") for _ in range(n))
    return {
        "github": "ghp_" + alnum(36), "github-oauth": "gho_" + alnum(36), "github-server": "ghs_" + alnum(36),
        "github-fine": "github_pat_" + alnum(22) + "_" + alnum(59), "slack": "xoxb-1234567890-" + alnum(24),
        "slack-user": "xoxp-1234567890-" + alnum(24), "aws": "AKIA" + "".join(secrets.choice("ABCDEFGHJKLMNPQRSTUVWXYZ234567")
                                                                      for _ in range(16)),
        "huggingface": "hf_" + alnum(30) + "7", "openai": "sk-proj-" + alnum(40) + "9", "gitlab": "glpat-" + alnum(20),
        "slack-hook": alnum(24), "discord-hook": alnum(40), "password": "x" + alnum(12),
    }


def hook_urls(values: dict[str, str]) -> dict[str, str]:
    return {"slack-hook": f"https://hooks.slack.com/services/T0AB12CDE/B0FG34HIJ/{values['slack-hook']}",
            "discord-hook": f"https://discord.com/api/webhooks/112233445566/{values['discord-hook']}"}


def test_each_secret_shape_is_hidden_in_a_text_an_environment_a_command_line_and_a_document():
    from ddp_preflight.node.redact import REDACTED, redact_argv, redact_env, redact_json, redact_text

    values = secret_values()
    urls = hook_urls(values)
    for kind, value in values.items():
        word = urls.get(kind, value)
        said = f"pushing with {word} now"
        if kind != "password":            # a password has no shape: it is hidden by its option or its name
            assert value not in redact_text(said), kind
            assert value not in " ".join(redact_argv(["train.py", word])), kind
            # A name the rules do not know (SOME_SETTING) is hidden whole; a safe one loses the shape.
            assert redact_env({"SOME_SETTING": word}) == {"SOME_SETTING": REDACTED}, kind
            assert value not in redact_env({"NCCL_DEBUG_FILE": word})["NCCL_DEBUG_FILE"], kind
            assert value not in json.dumps(redact_json({"note": said})), kind
        assert value not in json.dumps(redact_json({"api_key": [word, 1]})), kind
    # The names the rules missed, and the password that starts with '-'.
    password = "-x" + values["password"]
    env = {"SSHPASS": password, "GITHUB_PAT": values["github"], "GH_PAT": values["github"], "PATH": "/usr/bin",
           "NCCL_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "4"}
    assert redact_env(env) == {"SSHPASS": REDACTED, "GITHUB_PAT": REDACTED, "GH_PAT": REDACTED, "PATH": "/usr/bin",
                               "NCCL_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "4"}
    argv = ["train.py", "--password", password, "--db-passwd=" + password, "-password", password, "--no-auth",
            "--steps", "3", "sshpass", "-p", password, "mysql", "-p" + password, "-p", "8080"]
    assert redact_argv(argv) == ["train.py", "--password", REDACTED, "--db-passwd=" + REDACTED, "-password", REDACTED,
                                 "--no-auth", "--steps", "3", "sshpass", "-p", REDACTED, "mysql", "-p" + REDACTED,
                                 "-p", "8080"]
    assert redact_text(f"usage: tool --password {password} --steps 3") == \
        f"usage: tool --password {REDACTED} --steps 3"
    # A secret key's value, whatever it is: a list, a number, an object; a null or a flag says nothing.
    document = {"token": [values["github"]], "pin_password": 918273645, "credentials": {"user": "me", "key": "k"},
                "auth": True, "session": None, "steps": 3}
    assert redact_json(document) == {"token": REDACTED, "pin_password": REDACTED, "credentials": REDACTED,
                                     "auth": True, "session": None, "steps": 3}


def test_an_incident_bundle_keeps_no_secret_of_a_ranks_environment_or_command_line(tmp_path):
    # As an older agent would send them (not redacted on the node): the master redacts them again.
    from ddp_preflight.hangwatch.incident import write
    from ddp_preflight.hangwatch.model import Snapshot

    values = secret_values()
    urls = hook_urls(values)
    password = "-x" + values["password"]
    env = {"RANK": "1", "GLOO_SOCKET_IFNAME": "eth0", "SSHPASS": password, "GITHUB_PAT": values["github-fine"],
           "GH_PAT": values["github"], "SLACK_URL": urls["slack-hook"], "SOME_SETTING": values["aws"]}
    argv = ["/usr/bin/python3", "train.py", "--password", password, values["huggingface"], "--notify",
            urls["discord-hook"], "--api", values["openai"]]
    details = {"nodes": {"master": {"host": "master", "python": "3.11", "torch": "2.13", "py_spy": None}},
               "ranks": {"master:4242": {"argv": argv, "env": env, "master": "10.0.0.1:29500",
                                         "extra": {"token": [values["gitlab"]], "password": 918273645}}}}
    snapshot = Snapshot.from_json(json.loads((ART / "snapshots" / "deadlock.json").read_text()))
    snapshot.ranks[1].last_line = f"cloning with {values['github-oauth']} from {urls['slack-hook']}"
    snapshot.messages.append(f"worker1: xoxp token {values['slack-user']} and {values['github-server']}")
    bundle = Path(write(snapshot, details, str(tmp_path / "incidents")))
    written = {name: (bundle / name).read_text() for name in ("incident.json", "report.txt")}
    for kind, value in {**values, "pin": "918273645"}.items():
        for name, text in written.items():
            assert value not in text, (kind, name)
    rank = json.loads(written["incident.json"])["ranks"]["master:4242"]
    assert rank["env"] == {"RANK": "1", "GLOO_SOCKET_IFNAME": "eth0", "SSHPASS": "<redacted>",
                           "GITHUB_PAT": "<redacted>", "GH_PAT": "<redacted>", "SLACK_URL": "<redacted>",
                           "SOME_SETTING": "<redacted>"}
    assert rank["argv"][2:] == ["--password", "<redacted>", "<redacted>", "--notify",
                                "https://discord.com/<redacted>", "--api", "<redacted>"]
    assert "    GLOO_SOCKET_IFNAME=eth0" in written["report.txt"].splitlines()


def test_the_agent_redacts_the_second_users_ranks_environment_before_it_leaves_the_node(intruders_folder):
    """The agent as shipped (root, like the lab's), on a real process of the second user whose
    environment holds every shape: the rank message that leaves the node holds none of them."""
    import queue

    from ddp_preflight.node import protocol
    from ddp_preflight.transport import LocalNode

    user, folder = intruders_folder
    values = secret_values()
    urls = hook_urls(values)
    env = {**user.env(), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "NCCL_DEBUG": "INFO",
           "SSHPASS": "-x" + values["password"], "GITHUB_PAT": values["github"], "GH_PAT": values["github-fine"],
           "HOOK": urls["slack-hook"], "DISCORD": urls["discord-hook"], "SETTING": values["aws"],
           "NCCL_DEBUG_FILE": f"/tmp/{values['huggingface']}", **{f"X{i}": v for i, v in enumerate(values.values())}}
    rank = user.popen([SYSTEM_PYTHON, "-c", "import time; time.sleep(60)"], env=env)
    messages: queue.Queue = queue.Queue()
    agent = LocalNode("here", sys.executable).start(
        {"program": "agent", "node": "here", "interval": 0.2, "pids": [rank.pid], "native": False, "py_spy": None},
        keep_input=True, keep_marked=False, on_line=lambda line: messages.put((line, protocol.parse(line, protocol.AGENT))))
    said, found = [], None
    try:
        deadline = time.monotonic() + 30
        while found is None and time.monotonic() < deadline:
            try:
                line, message = messages.get(timeout=1)
            except queue.Empty:
                continue
            said.append(line)
            if message and message.get("type") == "rank" and message.get("pid") == rank.pid:
                found = message
    finally:
        agent.stop()
        agent.wait(10)
        rank.kill()
        rank.wait()
    assert found is not None, "the agent did not report the second user's process"
    assert found["env"]["RANK"] == "0" and found["env"]["NCCL_DEBUG"] == "INFO"
    assert found["env"]["SSHPASS"] == found["env"]["HOOK"] == found["env"]["SETTING"] == "<redacted>"
    everything = "\n".join(said)
    for kind, value in values.items():
        assert value not in everything, kind


# -- the red team's variants: secrets in a script's arguments and a rank's exception ----------------

def leak_values() -> dict[str, str]:
    """One fresh value per place a secret was seen to leak: the test greps for these exact strings."""
    return {kind: "V" + secrets.token_hex(8) for kind in (
        "pw", "sas", "odbc", "pwd", "curl", "dict", "yaml", "json", "sas-text", "token-option")}


SECRET_RAISES = """import json
v = json.loads(%r)
message = ("login failed for config {'user': 'svc', 'password': '%%s'} token: %%s " %% (v["dict"], v["yaml"])
           + json.dumps({"api_key": v["json"]})
           + " url https://a.blob.core.windows.net/c/x?sv=2022-11-02&sig=%%s" %% v["sas-text"])
print("hub refused HF_TOKEN=%%s --token %%s" %% (v["hf"], v["token-option"]), flush=True)
raise RuntimeError(message)
"""


def raising_script(values: dict[str, str]) -> str:
    """The script, its values in its own text (never in its command line, which the launcher shows)."""
    return SECRET_RAISES % json.dumps(values)


def hf_token() -> str:
    return "hf_" + secrets.token_hex(16) + "7"


def test_a_ranks_exception_leaves_no_secret_in_the_hangwatch_line_the_summary_or_the_bundle(
        intruders_folder, tmp_path, capsys):
    """The second user's script raises with secrets in the usual forms (a dict's repr, YAML-ish
    `token: X`, JSON, a SAS URL in free text): the launcher's hangwatch line, its "training failed"
    summary, result.json as written and the incident bundle keep none of them."""
    from ddp_preflight.cli.launch import say
    from ddp_preflight.launch.outcome import LaunchedRank, LaunchResult, NodeState, Why, render
    from ddp_preflight.node.redact import redact_json, redact_text
    from ddp_preflight.node.terminal import shown_text

    user, folder = intruders_folder
    values = {**leak_values(), "hf": hf_token()}
    script = user.file(folder / "train.py", raising_script(values))
    records = user.folder(folder / "records", 0o755)
    ran = user.run([SYSTEM_PYTHON, str(ROOT / "ddp_preflight" / "node" / "rank_bootstrap.py"), str(script)], check=False, cwd=str(folder),  # noqa: E501
                   env={**user.env(), "DDP_PREFLIGHT_FLIGHT_RECORDER": str(records)})
    assert ran.returncode == 1, ran.stderr
    ending = json.loads(next(records.glob("*.end")).read_text())
    assert values["dict"] in ending["message"]
    watcher, events = replay(hostile_recording("raise", ending), tmp_path)
    verdict = watcher.verdict()
    assert verdict is not None and verdict.named == (1,), [e.text for e in events]
    said = [e for e in events if e.kind == "diagnosis"]
    assert said, [e.text for e in events]
    say(f"hangwatch: {said[0].text}")
    line = capsys.readouterr().err
    hidden = ("RuntimeError: login failed for config {'user': 'svc', 'password': '<redacted>'} token: <redacted> "
              '{"api_key": "<redacted>"} url https://a.blob.core.windows.net/c/x?sv=2022-11-02&sig=<redacted>')
    assert line.startswith("ddp-preflight: hangwatch: EXITED: rank 1 on master raised " + hidden), line
    result = LaunchResult(
        ranks=[LaunchedRank(0, "master", 0, exit=None, signal=15, why=Why.STOPPED_BY_TORCHRUN, stopped_for=(1,)),
               LaunchedRank(1, "master", 1, exit=1),
               LaunchedRank(2, "worker1", 0, exit=None, signal=15, why=Why.STOPPED_BY_US),
               LaunchedRank(3, "worker1", 1, exit=None, signal=15, why=Why.STOPPED_BY_US)],
        nodes=[NodeState("master", "failed", exit=1), NodeState("worker1", "stopped", stopped=True)],
        stop_reason="rank 1 failed", first_failure="master", seconds=14.0, verdict=verdict)
    # As cli/launch.py prints the summary and launch/run.py writes result.json.
    summary = shown_text(redact_text(render(result, 29500, "master")))
    assert summary.splitlines()[0] == f"training failed: rank 1 on master raised {hidden} at train.py:7; " \
                                      "every node was stopped", summary
    written = {"summary": summary, "hangwatch line": line,
               "result.json": json.dumps(redact_json(result.to_json()))}
    bundles = sorted((tmp_path / "incidents").glob("*/*"))
    assert {p.name for p in bundles} >= {"incident.json", "report.txt"}, bundles
    written.update({str(p): p.read_text() for p in bundles})
    for kind, value in values.items():
        if kind in ("dict", "yaml", "json", "sas-text"):
            for where, text in written.items():
                assert value not in text, (kind, where)


def test_a_launch_shows_and_writes_no_secret_of_its_arguments_or_a_ranks_exception_and_explain_neither(tmp_path):
    """A real launch (local, as root) of a script given secrets as options (--pw, --pwd, --user
    user:password, a SAS URL, an ODBC string) that raises with secrets in its message: the
    launcher's lines, plan.json, result.json, error-rank-0.json, the bundle and each NODE.log's
    first line hold none of them; the rank's own lines (its output, as it printed it) are the only
    place they stay. `explain` of that folder, text or JSON, quotes those lines without them."""
    values = {**leak_values(), "hf": hf_token()}
    script = tmp_path / "train.py"
    script.write_text(raising_script(values))
    log_dir = tmp_path / "run"
    args = ["--pw", values["pw"], "--data", f"https://acct.blob.core.windows.net/c/x?sv=2022-11-02&sp=r&sig={values['sas']}",
            "--conn", f"Server=db;UID=sa;PWD={values['odbc']}", "--pwd", values["pwd"], "--user",
            f"admin:{values['curl']}", "-P", "2222", "--max-tokens", "512"]
    done = subprocess.run([sys.executable, "-m", "ddp_preflight", "--no-probes", "--force", "--master-port", str(free_port()),
                           "--launch", "--log-dir", str(log_dir), "--", str(script), *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    launching = next(line for line in done.stderr.splitlines() if line.startswith("ddp-preflight: launching "))
    assert ("--pw <redacted> --data https://acct.blob.core.windows.net/c/x?sv=2022-11-02&sp=r&sig=<redacted> "
            "--conn Server=db;UID=sa;PWD=<redacted> --pwd <redacted> --user admin:<redacted> -P 2222 "
            "--max-tokens 512 on 1 node(s)") in launching, launching
    secret = list(values.values())
    rank_line = re.compile(r"^\[[\w.-]+ r0\] ")

    def leaks(text: str, where: str, ranks_own: bool = False) -> None:
        for line in text.splitlines():
            held = [v for v in secret if v in line]
            assert not held or (ranks_own and rank_line.match(line)), (where, held, line)

    leaks(done.stderr, "the launcher's lines")
    leaks(done.stdout, "the terminal", ranks_own=True)
    files = sorted(p for p in log_dir.rglob("*") if p.is_file())
    assert {p.name for p in files} >= {"plan.json", "result.json", "error-rank-0.json", "incident.json", "report.txt"}
    for path in files:
        leaks(path.read_text(), str(path), ranks_own=path.suffix == ".log")
    explained = cli("explain", str(log_dir))
    as_json = cli("explain", "--json", str(log_dir))
    for where, output in (("explain", explained), ("explain --json", as_json)):
        assert output.returncode == 1, output.stderr
        for value in secret:
            assert value.encode() not in output.stdout + output.stderr, (where, value)
    text = explained.stdout.decode()
    assert "HF_TOKEN=<redacted> --token <redacted>" in text or "'password': '<redacted>'" in text, text
