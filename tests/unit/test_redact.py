"""What is shown or written: secrets redacted by name and by value (issue 10.3's examples), and a
rank's text made harmless for a terminal."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import time

import pytest

from ddp_preflight.node import protocol
from ddp_preflight.node.redact import REDACTED, redact_argv, redact_env, redact_json, redact_text, secret_name
from ddp_preflight.node.terminal import visible
from ddp_preflight.transport import LocalNode


@pytest.mark.parametrize("name", [
    "AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "WANDB_API_KEY", "PASSWORD", "MY_PASS", "PGPASSWORD", "MYSQL_PWD",
    "GITHUB_TOKEN", "OPENAI_APIKEY", "DB_PASSWD", "SESSION_COOKIE", "GOOGLE_APPLICATION_CREDENTIALS",
    "apiKey", "--api-key", "--password", "wandb.api_key", "X-Amz-Credential", "hf_token"])
def test_names_that_say_secret_as_a_word_part(name):
    assert secret_name(name)


@pytest.mark.parametrize("name", [
    "KEYBOARD", "TOKENIZERS_PARALLELISM", "AUTHOR", "PWD", "OLDPWD", "HOCKEY", "DATABASE_URL", "MASTER_ADDR",
    "GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS", "PASSTHROUGH_MODE", "--max-tokens", "--steps"])
def test_harmless_names_are_kept(name):
    assert not secret_name(name)


def test_an_environment_shows_values_only_for_names_known_safe():
    # By allow-list (issue 23, attack 11): a name the rules do not know is hidden, whatever it holds
    # (DATABASE_URL, KEYBOARD); a safe name's value still loses the credentials inside it.
    env = {"AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI", "HF_TOKEN": "hf_abc", "WANDB_API_KEY": "0123abcd",
           "PASSWORD": "hunter2", "MY_PASS": "x", "DATABASE_URL": "postgres://u:p@db:5432/x",
           "MIRROR": "https://user:pass@host/simple", "SIGNED": "https://s3/b/o?X-Amz-Signature=abc&x=1",
           "GLOO_SOCKET_IFNAME": "eth0", "KEYBOARD": "us", "TOKENIZERS_PARALLELISM": "false",
           "TORCH_HUB_TOKEN": "t0k", "MASTER_ADDR": "10.0.0.1", "PYTHONPATH": "https://u:p@h/x"}
    assert redact_env(env) == {
        "AWS_SECRET_ACCESS_KEY": REDACTED, "HF_TOKEN": REDACTED, "WANDB_API_KEY": REDACTED, "PASSWORD": REDACTED,
        "MY_PASS": REDACTED, "DATABASE_URL": REDACTED, "MIRROR": REDACTED, "SIGNED": REDACTED,
        "GLOO_SOCKET_IFNAME": "eth0", "KEYBOARD": REDACTED, "TOKENIZERS_PARALLELISM": "false",
        "TORCH_HUB_TOKEN": REDACTED, "MASTER_ADDR": "10.0.0.1", "PYTHONPATH": "https://<redacted>@h/x"}


def test_credentials_in_any_value_whatever_its_name():
    assert redact_text("postgres://u:p@db:5432/x") == "postgres://<redacted>@db:5432/x"
    assert redact_text("https://s3/b/o?X-Amz-Signature=abc&x=1") == "https://s3/b/o?X-Amz-Signature=<redacted>&x=1"


def test_a_url_keeps_its_scheme_and_host_and_loses_its_user_and_password():
    assert redact_text("postgres://u:p@db:5432/x") == "postgres://<redacted>@db:5432/x"
    assert redact_text("redis://:s3cr@t@cache:6379/0") == "redis://<redacted>@cache:6379/0"    # an @ in the password
    assert redact_text("https://host:443/a@b and mailto:me@host") == "https://host:443/a@b and mailto:me@host"


def test_a_command_line_loses_secret_options_values_and_credentials_in_words():
    argv = ["train.py", "--token", "hf_abc", "--password=hunter2", "--no-auth", "--steps", "3",
            "--data", "https://user:pass@host/x", "wandb.api_key=0123", "-H", "Authorization: Bearer abcdefgh1234"]
    assert redact_argv(argv) == ["train.py", "--token", REDACTED, f"--password={REDACTED}", "--no-auth", "--steps", "3",
                                 "--data", "https://<redacted>@host/x", f"wandb.api_key={REDACTED}",
                                 "-H", f"Authorization: Bearer {REDACTED}"]


def test_headers_and_bearer_tokens_in_a_line():
    line = 'curl -H "Authorization: Basic dXNlcjpwYXNz" -H "Cookie: a=1; b=2" https://x; Bearer abcdefgh12345'
    assert redact_text(line) == (f'curl -H "Authorization: Basic {REDACTED}" -H "Cookie: {REDACTED}" https://x; '
                                 f"Bearer {REDACTED}")


def test_a_document_loses_secret_keys_text_and_credentials_anywhere():
    document = {"env": {"HF_TOKEN": "hf_abc", "N": 3}, "errors": ["cannot reach postgres://u:p@db/x"],
                "api_key": None, "tokens_per_rank": 5}
    assert redact_json(document) == {"env": {"HF_TOKEN": REDACTED, "N": 3},
                                     "errors": ["cannot reach postgres://<redacted>@db/x"],
                                     "api_key": None, "tokens_per_rank": 5}


def test_a_ranks_escape_sequences_are_shown_not_obeyed():
    line = "\x1b]0;owned\x07\x1b[2J\x1b[31mred\tafter a tab\x9b1m\x7f"
    assert visible(line) == "^[]0;owned^G^[[2J^[[31mred\tafter a tab" + "M-^[1m^?"
    # A carriage return leaves what a terminal would show: the progress bar's last state.
    assert visible(" 10%|#   |\r 20%|##  |\r") == " 20%|##  |"


def test_the_agent_as_shipped_redacts_a_real_processs_environment():
    """The agent as it runs on a node (shipped by the transport), on a real process."""
    secrets = {"HF_TOKEN": "hf_sent_to_the_rank", "DATABASE_URL": "postgres://u:pw_of_db@db:5432/x"}
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            env={**os.environ, "RANK": "0", "LOCAL_RANK": "0", **secrets})
    messages: queue.Queue = queue.Queue()
    agent = LocalNode("here", sys.executable).start(
        {"program": "agent", "node": "here", "interval": 0.2, "pids": [rank.pid], "native": False, "py_spy": None},
        keep_input=True, keep_marked=False, on_line=lambda line: messages.put(protocol.parse(line, protocol.AGENT)))
    try:
        deadline, found = time.monotonic() + 20, None
        while found is None and time.monotonic() < deadline:
            try:
                message = messages.get(timeout=1)
            except queue.Empty:
                continue
            if message and message.get("type") == "rank" and message.get("pid") == rank.pid:
                found = message
    finally:
        agent.stop()
        agent.wait(10)
        rank.kill()
        rank.wait()
    assert found is not None, "the agent did not report the rank"
    assert found["env"]["HF_TOKEN"] == REDACTED
    assert found["env"]["DATABASE_URL"] == REDACTED and found["env"]["RANK"] == "0"     # by allow-list


def test_the_agent_module_on_the_master_uses_the_same_rules():
    from ddp_preflight.node.agent import redact_env as redact
    assert redact({"MY_PASS": "x", "URL": "https://a:b@h/", "NCCL_DEBUG": "INFO"}) == {
        "MY_PASS": REDACTED, "URL": REDACTED, "NCCL_DEBUG": "INFO"}


# -- the red team's variants of issue 23 (attack 11 again): what the rules missed --------------------

def fresh() -> str:
    """A value no rule could know by its shape: only where it stands can hide it."""
    import secrets
    return "V" + secrets.token_hex(8)


def test_a_script_options_that_hold_a_password_lose_their_value():
    values = [fresh() for _ in range(9)]
    argv = ["train.py", "--pw", values[0], "--pwd", values[1], "--passwd", values[2], f"--pw={values[3]}",
            "--user", f"admin:{values[4]}", "-u", f"admin:{values[5]}", f"--user=admin:{values[6]}",
            f"--token:{values[7]}", "--sig", values[8]]
    assert redact_argv(argv) == ["train.py", "--pw", REDACTED, "--pwd", REDACTED, "--passwd", REDACTED,
                                 f"--pw={REDACTED}", "--user", f"admin:{REDACTED}", "-u", f"admin:{REDACTED}",
                                 f"--user=admin:{REDACTED}", f"--token:{REDACTED}", "--sig", REDACTED]
    line = f"curl --user admin:{values[4]} -u bob:{values[5]} https://h/x"
    assert redact_text(line) == f"curl --user admin:{REDACTED} -u bob:{REDACTED} https://h/x"


def test_a_port_a_user_a_switch_and_minus_capital_p_are_shown():
    # -P is a port (scp, mysql, curl's FTP port), a folder (wget), a count (xargs) or a switch
    # (rsync, cp) far more often than a password: shown, as -p is (docs/security.md says so).
    argv = ["train.py", "-P", "2222", "-p", "8080", "--user", "alice", "-u", "--max-tokens", "512", "--steps", "3",
            "python", "-u", "train.py", "--author", "me", "--keyboard", "us"]
    assert redact_argv(argv) == argv


def test_a_connection_strings_password_is_hidden_and_the_shells_folder_is_not():
    value, braced = fresh(), fresh()
    assert redact_text(f"Server=db;UID=sa;PWD={value};Encrypt=yes") == f"Server=db;UID=sa;PWD={REDACTED};Encrypt=yes"
    assert redact_text(f"Driver={{ODBC 18}};Uid=sa;Pwd={{{braced} x}};") == f"Driver={{ODBC 18}};Uid=sa;Pwd={REDACTED};"
    assert redact_text(f"pwd={value}") == f"pwd={REDACTED}"
    # The shell's PWD is a folder: shown, as a variable and in a text.
    assert redact_env({"PWD": "/home/alice/run"}) == {"PWD": "/home/alice/run"}
    assert redact_text("PWD=/home/alice/run OLDPWD=/tmp") == "PWD=/home/alice/run OLDPWD=/tmp"
    assert not secret_name("PWD") and secret_name("--pwd") and secret_name("pwd")


@pytest.mark.parametrize("key", ["sig", "signature", "X-Amz-Signature", "X-Goog-Signature", "token", "access_token",
                                 "api_key", "key", "secret", "password", "code", "client_secret"])
def test_a_signed_urls_secret_query_keys_lose_their_value(key):
    value = fresh()
    url = f"https://acct.blob.core.windows.net/c/x.bin?sv=2022-11-02&sp=r&{key}={value}&se=2030-01-01"
    assert redact_text(url) == \
        f"https://acct.blob.core.windows.net/c/x.bin?sv=2022-11-02&sp=r&{key}={REDACTED}&se=2030-01-01"
    assert redact_argv(["train.py", "--data", url])[2] == redact_text(url)


def test_a_signature_in_free_text_and_a_urls_fragment_are_hidden():
    value = fresh()
    assert redact_text(f"GET /c/x?sv=2022&sig={value} failed") == f"GET /c/x?sv=2022&sig={REDACTED} failed"
    assert redact_text(f"https://h/cb#access_token={value}&state=1") == f"https://h/cb#access_token={REDACTED}&state=1"


def test_a_urls_ordinary_query_is_kept():
    for url in ("https://pypi.org/simple/torch/?format=json", "https://h/x?page=2&code_version=3&keyboard=us",
                "https://h/x?tokens_per_batch=512"):
        assert redact_text(url) == url


def test_basic_auth_is_hidden_in_a_header_and_in_a_text():
    import base64
    value = fresh()
    basic = base64.b64encode(f"admin:{value}".encode()).decode()
    assert redact_text(f"-H 'Authorization: Basic {basic}'") == f"-H 'Authorization: Basic {REDACTED}'"
    assert redact_text(f"sent Basic {basic} to the proxy") == f"sent Basic {REDACTED} to the proxy"
    assert redact_argv(["train.py", "--header", f"Authorization: Basic {basic}"])[2] == \
        f"Authorization: Basic {REDACTED}"
    # "Basic" as a word, before a word that is no user:password.
    assert redact_text("Basic training loop: 3 steps") == "Basic training loop: 3 steps"


def test_key_value_pairs_in_free_text_lose_a_secret_keys_value():
    v = [fresh() for _ in range(10)]
    said = {
        f"login failed for config {{'user': 'svc', 'password': '{v[0]}'}}":
            f"login failed for config {{'user': 'svc', 'password': '{REDACTED}'}}",
        f"token: {v[1]} and more": f"token: {REDACTED} and more",
        f'body {{"api_key": "{v[2]}", "n": 3}}': f'body {{"api_key": "{REDACTED}", "n": 3}}',
        f'escaped {{\\"api_key\\": \\"{v[3]}\\"}}': f'escaped {{\\"api_key\\": \\"{REDACTED}\\"}}',
        f"TOKEN = {v[4]}": f"TOKEN = {REDACTED}",
        f"api_key:{v[5]}": f"api_key:{REDACTED}",
        f"aws_secret_access_key = {v[6]}": f"aws_secret_access_key = {REDACTED}",
        f"X-Goog-Api-Key: {v[7]}": f"X-Goog-Api-Key: {REDACTED}",
        # Under a secret key, a list or an object goes whole (as redact_json hides it); inside another, the key's value.
        f"{{'token': ['{v[8]}', 'b'], 'credentials': {{'user': 'u', 'pass': '{v[9]}'}}}}":
            f"{{'token': {REDACTED}, 'credentials': {REDACTED}}}",
        f"{{'db': {{'user': 'u', 'pass': '{v[9]}'}}}}": f"{{'db': {{'user': 'u', 'pass': '{REDACTED}'}}}}",
    }
    for text, hidden in said.items():
        assert redact_text(text) == hidden, text


def test_ordinary_key_value_text_is_kept():
    for text in ("KeyError: 'LOCAL_RANK'", "TOKENIZERS_PARALLELISM=false", "--max-tokens 512", "author: me",
                 "keyboard: us", "DataLoader(pin_memory=True, num_workers=4)", "signal: SIGTERM",
                 "exit code=1", "tokens: 4096", "monkey: 1", "Epoch 3: loss=0.25 lr=0.001",
                 "TokenizerWarning: token indices sequence length is 600", "state_dict: missing keys",
                 # torch's store names its keys so (tests/unit/artifacts/pasted/071-*): no secret.
                 "store based barrier on rank: 7, for key: store_based_barrier_key:1 (world_size=8)"):
        assert redact_text(text) == text, text
