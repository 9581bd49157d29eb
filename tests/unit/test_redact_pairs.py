"""Redaction, issue 34 part B: option pairs, token shapes with no extra condition, bytes and call
reprs, `user:secret@` in any value, and harmless values shown. Each case has a fresh value no rule
could know by its shape, and variants the issue did not list."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp_preflight.node.ranks import Finder
from ddp_preflight.node.redact import REDACTED, redact_argv, redact_env, redact_json, redact_text

from .ports import free_port

ROOT = Path(__file__).parents[2]


def fresh() -> str:
    return "V" + secrets.token_hex(8)


def test_a_secret_option_followed_by_another_secret_option_hides_both_values():
    v = [fresh() for _ in range(6)]
    argv = ["train.py", "--password", "--token", v[0], "-p" + v[1], "--client-secret", v[2],
            "--api-key", "--secret", v[3], "--passphrase", f"--auth-token={v[4]}", "--steps", "3"]
    assert redact_argv(argv) == ["train.py", "--password", REDACTED, REDACTED, f"-p{REDACTED}", "--client-secret",
                                 REDACTED, "--api-key", REDACTED, REDACTED, "--passphrase", REDACTED, "--steps", "3"]
    line = " ".join(argv)
    assert redact_text(line) == " ".join(redact_argv(argv))
    # A switch before a secret option hides nothing of its own; the option's value goes.
    assert redact_argv(["t.py", "--no-auth", "--token", v[5], "--steps", "3"]) == \
        ["t.py", "--no-auth", "--token", REDACTED, "--steps", "3"]


@pytest.mark.parametrize("word,shown", [
    ("-pMYSQLPASS", False), ("-phunter2", False), ("-pS3cr3t!", False), ("-p2222", True), ("-p/data/x", True),
    ("-p", True), ("-pthread", True), ("-pipe", True)])
def test_minus_p_with_an_attached_value_is_hidden_unless_a_port_a_folder_or_a_compilers_switch(word, shown):
    assert (redact_argv(["train.py", word]) == ["train.py", word]) is shown
    assert (redact_text(f"run: train.py {word} --steps 3") == f"run: train.py {word} --steps 3") is shown


@pytest.mark.parametrize("token", [
    "hf_" + "abcdefghijklmnopqrstuvwxyzABCDEFGH",            # letters only
    "hf_" + "9d60e642ea4b8f6e898fbed436e065b653",   # one collection for every xdist worker: no random id
    "sk-" + "proj-abcdefghijklmnopqrstuvwxyz",             # letters only
    "sk-ant-" + "AbCdEfGhIjKlMnOpQrStUvWx"])
def test_each_listed_token_shape_is_hidden_without_extra_conditions(token):
    for text in (f"using {token} now", f"HF={token}", f"{{'x': '{token}'}}"):
        assert token not in redact_text(text), text
    assert token not in redact_env({"NCCL_DEBUG_FILE": token})["NCCL_DEBUG_FILE"]


def test_bytes_and_call_reprs_under_a_secret_key_or_a_secret_class_are_hidden():
    v = [fresh() for _ in range(8)]
    said = {
        f"{{'password': b'{v[0]}'}}": f"{{'password': b'{REDACTED}'}}",
        f"{{'token': rb'{v[1]}', 'n': 3}}": f"{{'token': rb'{REDACTED}', 'n': 3}}",
        f"{{'api_key': bytearray(b'{v[2]}')}}": f"{{'api_key': {REDACTED}}}",
        f"SecretStr('{v[3]}')": f"SecretStr({REDACTED})",
        f"Settings(db=SecretBytes(b'{v[4]}'), steps=3)": f"Settings(db=SecretBytes({REDACTED}), steps=3)",
        f"Config(password=Password('{v[5]}'), lr=0.1)": f"Config(password={REDACTED}, lr=0.1)",
        f"client_secret = memoryview(b'{v[6]}')": f"client_secret = {REDACTED}",
        f"{{\"secret\": u'{v[7]}'}}": f"{{\"secret\": u'{REDACTED}'}}",
    }
    for text, hidden in said.items():
        assert redact_text(text) == hidden, text
    # A call of a harmless class is shown; a call's closing parenthesis stays where it was.
    assert redact_text("DataLoader(dataset, batch_size=32)") == "DataLoader(dataset, batch_size=32)"
    assert redact_text(f"Config(api_key=SecretStr('{v[0]}'))") == f"Config(api_key={REDACTED})"
    assert redact_text(f"connect(password={v[1]})") == f"connect(password={REDACTED})"


def test_user_and_password_before_an_at_are_hidden_in_any_value_with_or_without_a_scheme():
    v = [fresh() for _ in range(5)]
    env = {"MASTER_ADDR": f"admin:{v[0]}@10.0.0.1", "TORCH_NCCL_DEBUG_INFO": f"svc:{v[1]}@host:5000",
           "NCCL_DEBUG_FILE": f"/tmp/x ftp:{v[2]}@files", "PYTHONPATH": f"https://u:{v[3]}@h/x"}
    assert redact_env(env) == {"MASTER_ADDR": f"admin:{REDACTED}@10.0.0.1",
                               "TORCH_NCCL_DEBUG_INFO": f"svc:{REDACTED}@host:5000",
                               "NCCL_DEBUG_FILE": f"/tmp/x ftp:{REDACTED}@files",
                               "PYTHONPATH": f"https://{REDACTED}@h/x"}
    assert redact_argv(["t.py", "--db", f"bob:{v[4]}@db:5432/x"]) == ["t.py", "--db", f"bob:{REDACTED}@db:5432/x"]
    assert redact_json({"addr": f"admin:{v[0]}@h"}) == {"addr": f"admin:{REDACTED}@h"}
    # Not a password: an e-mail, git's remote, a time, mailto:.
    for text in ("mail me@host.org", "git@github.com:org/x.git", "at 12:30 on node1", "mailto:me@host"):
        assert redact_text(text) == text


def test_values_of_plainly_harmless_names_are_shown_and_unknown_words_are_not():
    env = {"STEPS": "100", "BATCH_SIZE": "32", "LR": "3e-4", "NUM_WORKERS": "4", "RUN_NAME": "exp-7",
           "DATA_DIR": "/data/shards", "SOME_FLAG": "true", "SOME_FOLDER": "/srv/x", "SOME_COUNT": "12",
           "KEYBOARD": "us", "SOME_SETTING": "hunter2", "MY_PIN_PASSWORD": "1234", "STEPS_TOKEN": "100",
           "RUN_NAME_2": f"u:{fresh()}@h"}
    shown = redact_env(env)
    assert shown == {**env, "KEYBOARD": REDACTED, "SOME_SETTING": REDACTED, "MY_PIN_PASSWORD": REDACTED,
                     "STEPS_TOKEN": REDACTED, "RUN_NAME_2": f"u:{REDACTED}@h"}


SCRIPT = """import os, sys
print("started with", len(sys.argv), "words", flush=True)
raise SystemExit(3)
"""


def test_a_launch_writes_no_value_of_a_secret_option_pair_or_a_user_password_in_a_safe_variable(tmp_path):
    """A real local launch with the issue's command line and a safe-named variable holding
    user:password@: the launch line, plan.json, result.json, the node log's first line and the
    bundle hold none of the values; STEPS=100 is shown as it is."""
    v = {kind: fresh() for kind in ("token", "mysql", "client", "addr", "apikey")}
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    log_dir = tmp_path / "run"
    args = ["--password", "--token", v["token"], "-p" + v["mysql"], "--client-secret", v["client"],
            "--api-key", "--secret", v["apikey"], "--steps", "3"]
    done = subprocess.run([sys.executable, "-m", "ddp_preflight", "--no-probes", "--force", "--master-port", str(free_port()),
                           "--env", f"TORCH_NCCL_DEBUG_INFO=svc:{v['addr']}@db", "--env", "STEPS=100",
                           "--launch", "--log-dir", str(log_dir), "--", str(script), *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    launching = next(line for line in done.stderr.splitlines() if line.startswith("ddp-preflight: launching "))
    assert (f"--password {REDACTED} {REDACTED} -p{REDACTED} --client-secret {REDACTED} --api-key {REDACTED} "
            f"{REDACTED} --steps 3 on 1 node(s)") in launching, launching
    for value in v.values():
        assert value not in done.stderr, value
    plan = json.loads((log_dir / "plan.json").read_text())
    env = plan["nodes"][0]["env"]
    assert env["STEPS"] == "100" and env["TORCH_NCCL_DEBUG_INFO"] == f"svc:{REDACTED}@db", env
    files = [p for p in log_dir.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"plan.json", "result.json"}
    for path in files:
        text = path.read_text()
        for value in v.values():
            assert value not in text, (path, value)


def test_an_incident_bundle_keeps_no_password_of_a_safe_named_variable_or_an_option_pair(tmp_path):
    """The bundle of a real recorded deadlock, its rank given (as an older agent would send them,
    unredacted) MASTER_ADDR and TORCH_NCCL_DEBUG_INFO with user:password@, its store address so,
    and the issue's command line: incident.json and report.txt hold none of the values; STEPS=100
    is shown."""
    from ddp_preflight.hangwatch.incident import write
    from ddp_preflight.hangwatch.model import Snapshot

    v = {kind: fresh() for kind in ("addr", "debug", "token", "mysql", "client", "bytes")}
    env = {"RANK": "1", "MASTER_ADDR": f"admin:{v['addr']}@10.0.0.1", "STEPS": "100",
           "TORCH_NCCL_DEBUG_INFO": f"svc:{v['debug']}@dbg:9000"}
    argv = ["/usr/bin/python3", "train.py", "--password", "--token", v["token"], "-p" + v["mysql"],
            "--client-secret", v["client"]]
    details = {"nodes": {"master": {"host": "master", "python": "3.11", "torch": "2.13", "py_spy": None}},
               "ranks": {"master:4242": {"argv": argv, "env": env, "master": f"admin:{v['addr']}@10.0.0.1:29500",
                                         "extra": f"{{'password': b'{v['bytes']}'}}"}}}
    art = Path(__file__).parent / "artifacts"
    snapshot = Snapshot.from_json(json.loads((art / "snapshots" / "deadlock.json").read_text()))
    bundle = Path(write(snapshot, details, str(tmp_path / "incidents")))
    written = {name: (bundle / name).read_text() for name in ("incident.json", "report.txt")}
    for name, text in written.items():
        for kind, value in v.items():
            assert value not in text, (name, kind)
    rank = json.loads(written["incident.json"])["ranks"]["master:4242"]
    assert rank["env"] == {"RANK": "1", "MASTER_ADDR": f"admin:{REDACTED}@10.0.0.1", "STEPS": "100",
                           "TORCH_NCCL_DEBUG_INFO": f"svc:{REDACTED}@dbg:9000"}
    assert rank["argv"][2:] == ["--password", REDACTED, REDACTED, f"-p{REDACTED}", "--client-secret", REDACTED]
    assert rank["master"] == f"admin:{REDACTED}@10.0.0.1:29500"
    assert "    STEPS=100" in written["report.txt"].splitlines()


def test_a_ranks_store_address_leaves_the_node_without_its_password():
    """A real process whose MASTER_ADDR holds user:password@ (and a torchrun's endpoint so): what
    the rank finder reports (the agent's rank and launcher messages, shown in events and bundles)
    holds no password."""
    value = fresh()
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": f"admin:{value}@127.0.0.1",
           "MASTER_PORT": "29511"}
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "torchrun",
                                 "--rdzv-endpoint", f"bob:{value}@127.0.0.1:29512"], env=os.environ)
    try:
        time.sleep(0.3)
        finder = Finder()
        found = finder.scan()
        assert found[rank.pid]["master"] == f"admin:{REDACTED}@127.0.0.1:29511"
        assert finder.launchers[launcher.pid]["master"] == f"bob:{REDACTED}@127.0.0.1:29512"
    finally:
        for p in (rank, launcher):
            p.kill()
            p.wait()
