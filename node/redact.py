"""Secrets redacted by their name and by their value, in everything that is shown or written.

Pure, standard library only: the agent redacts the environments it reads before they leave a
node, and the master redacts what it prints and writes, by the same rules.

The rules, in the user's words:
- a variable, option or JSON key whose name has a secret word as one of its parts: HF_TOKEN,
  WANDB_API_KEY, AWS_SECRET_ACCESS_KEY, MY_PASS, PGPASSWORD, --api-key, apiKey; not KEYBOARD,
  TOKENIZERS_PARALLELISM, AUTHOR or PWD (the current folder);
- a value that carries a credential whatever its name: a URL's user and password (kept: the
  scheme and the host, `postgres://<redacted>@db:5432/x`), an Authorization or Cookie header, a
  Bearer token, and NAME=VALUE pairs with a secret name inside a value (a query string's
  `token=...`, a connection string's `AccountKey=...`);
- in a command line, the word after a secret option (`--token X`) and `--password=X`."""

from __future__ import annotations

import re

REDACTED = "<redacted>"

# A name's parts: split at _ - . and where lower case turns upper (apiKey); digits apart.
NAME_PARTS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
SECRET_PARTS = frozenset({
    "TOKEN", "SECRET", "SECRETS", "PASS", "PASSWD", "PASSWORD", "PASSWORDS", "PASSPHRASE", "PWD",
    "KEY", "APIKEY", "AUTH", "AUTHORIZATION", "CREDENTIAL", "CREDENTIALS", "CREDS", "COOKIE",
    "COOKIES", "SESSION", "SIGNATURE"})
# Parts written as one word with a prefix: PGPASSWORD, ACCESSTOKEN, CLIENTSECRET, OPENAIAPIKEY.
# (KEY alone is not a suffix: MONKEY, HOCKEY.)
SECRET_SUFFIXES = ("PASSWORD", "PASSWD", "PASSPHRASE", "TOKEN", "SECRET", "APIKEY", "ACCESSKEY", "PRIVATEKEY")

URL_CREDENTIALS = re.compile(r"\b([A-Za-z][A-Za-z0-9+.\-]*://)[^\s/?#]*@")     # up to the host's last @
HEADER = re.compile(r"(?i)\b((?:proxy-)?authorization|x-api-key|x-auth-token)(\s*:\s*)"
                    r"(?:(bearer|basic|token|digest|negotiate)\s+)?[^\s'\"]+")
COOKIE_HEADER = re.compile(r"(?i)\b((?:set-)?cookie)(\s*:\s*)[^\r\n'\"]+")
BEARER = re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9\-._~+/]{8,}=*")
PAIR = re.compile(r"(?<![\w.\-])(-{0,2}[A-Za-z_][\w.\-]*)=([^\s;&,]+)")
OPTION = re.compile(r"--?[A-Za-z][\w.\-]*")

def secret_name(name: str) -> bool:
    """Does this name say it holds a secret? (HF_TOKEN, MY_PASS, --api-key, PGPASSWORD: yes.)"""
    parts = [p.upper() for p in NAME_PARTS.findall(name)]
    if parts == ["PWD"]:             # the shell's current folder, not a password
        return False
    return any(p in SECRET_PARTS or p.endswith(SECRET_SUFFIXES) for p in parts)


def redact_text(text: str) -> str:
    """The credentials inside a value or a line, whatever the variable holding it is called."""
    text = URL_CREDENTIALS.sub(lambda m: f"{m.group(1)}{REDACTED}@", text)
    text = HEADER.sub(lambda m: m.group(1) + m.group(2) + (f"{m.group(3)} " if m.group(3) else "") + REDACTED, text)
    text = COOKIE_HEADER.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
    text = BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    return PAIR.sub(lambda m: f"{m.group(1)}={REDACTED}" if secret_name(m.group(1)) else m.group(0), text)


def redact_env(env: dict) -> dict:
    """An environment to show: secret names' values hidden, credentials in the others too."""
    return {name: REDACTED if secret_name(name) else redact_text(value) for name, value in env.items()}


def redact_argv(argv: list) -> list:
    """A command line to show: `--token X` and `--password=X` hidden, credentials in any word too.
    A secret option followed by another option is a flag (--no-auth), and hides nothing."""
    out = []
    hide_next = False
    for word in argv:
        if hide_next and not word.startswith("-"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = bool(OPTION.fullmatch(word)) and secret_name(word)
        out.append(redact_text(word))
    return out


def redact_json(value):
    """A JSON document to write: a secret key's text hidden, every other text through redact_text."""
    if isinstance(value, dict):
        return {key: REDACTED if isinstance(item, str) and secret_name(str(key)) else redact_json(item)
                for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_json(item) for item in value]
    if isinstance(value, str):
        return redact_text(value)
    return value
