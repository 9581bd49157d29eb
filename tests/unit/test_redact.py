"""What is shown or written: secrets redacted by name and by value (issue 10.3's examples), and a
rank's text made harmless for a terminal."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import time

import pytest

from node import protocol
from node.redact import REDACTED, redact_argv, redact_env, redact_json, redact_text, secret_name
from node.terminal import visible
from transport import LocalNode


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
    from node.agent import redact_env as redact
    assert redact({"MY_PASS": "x", "URL": "https://a:b@h/", "NCCL_DEBUG": "INFO"}) == {
        "MY_PASS": REDACTED, "URL": REDACTED, "NCCL_DEBUG": "INFO"}
