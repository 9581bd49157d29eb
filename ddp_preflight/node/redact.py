"""Secrets redacted, in everything that is shown or written: one set of rules.

Pure, standard library only: the agent and the facts collector redact the environments they
read before they leave a node, and the master redacts what it prints and writes, by the same
rules. Where in doubt, a value is hidden: a hidden harmless value costs a look at the node, a
shown secret cannot be taken back.

The rules, in the user's words:
- an environment (`--env`, a node's, a rank's) shows a value for a name known to be safe:
  the settings that decide how training binds, threads and picks its devices (PATH-like folders,
  CUDA_*, NCCL_*, GLOO_*, OMP_*, TORCH_*, MASTER_*, WORLD_SIZE, RANK, ...: `SAFE_NAMES`,
  `SAFE_PREFIXES`), for a name made of a training's setting words only (BATCH_SIZE, RUN_NAME),
  and a plain value (a number, a yes or no, a folder: STEPS=100) under any other name; not even
  then when the name says secret; every other value is `<redacted>` (node/secret_names.py);
- a variable, option or JSON key whose name has a secret word as one of its parts: HF_TOKEN,
  WANDB_API_KEY, AWS_SECRET_ACCESS_KEY, MY_PASS, PGPASSWORD, SSHPASS, GITHUB_PAT, --api-key,
  apiKey; not KEYBOARD, TOKENIZERS_PARALLELISM, AUTHOR, BYPASS or PWD (the current folder). A
  JSON value under such a key is hidden whatever it is (text, number, list, object);
- a value that carries a credential whatever its name: the token shapes of common services
  (GitHub's ghp_/gho_/ghs_/github_pat_, Slack's xox?-, AWS's AKIA..., Hugging Face's hf_,
  OpenAI's sk-, GitLab's glpat-, ...), a webhook URL's secret path (Slack, Discord, Teams, any
  .../hooks/...: the scheme and host kept), a URL's user and password (kept: the scheme and the
  host, `postgres://<redacted>@db:5432/x`), a password before an @ with no scheme
  (`admin:<redacted>@db`), the value a class named secret holds (`SecretStr(<redacted>)`), a
  signed URL's secret query keys (sig, signature, X-Amz-Signature,
  token, key, code, ...: `?sv=2022&sig=<redacted>`), an Authorization or Cookie
  header, a Bearer token, Basic auth (base64 of user:password);
- in free text (an exception's message, a traceback's source line), a key with a secret name and
  its value, as a dict's repr, JSON, YAML or a NAME=VALUE pair writes them (`{'password': 'X'}`,
  `{'token': b'X'}`, `{'api_key': bytearray(b'X')}`, `"api_key": "X"`,
  `token: X`, `TOKEN = X`, `PWD=X;` of a connection string); an exception's
  name (KeyError: ...) is not a key;
- in a command line, the value after a secret option however it is written (`--token X`,
  `--password=X`, `--pw X`, `--password -xSECRET`: a password option's value may start with '-';
  `--password --token X`: the word after a password option is hidden, and when it is a secret
  option its own value too, so that neither reading shows a secret),
  the password of `--user user:password` (curl's -u), and the password of the programs whose `-p`
  is one (sshpass -p X, mysql -pX), and any `-pX` whose X is not a port or a folder (`-pMYSQLPASS`:
  which program reads it a word does not say); `-p 8080`, `-p2222` and `-P` are a port, a folder
  or a switch and are shown."""

from __future__ import annotations

import base64
import binascii
import re

from .secret_names import (
    NAME_PARTS,
    harmless_name,
    plain_value,
    safe_name,
    secret_name,
    secret_part,
    shown_variable,
    takes_secret_value,
)

__all__ = ["REDACTED", "harmless_name", "plain_value", "redact_argv", "redact_env", "redact_json", "redact_text",
           "safe_name", "secret_name", "shown_variable", "takes_secret_value"]

REDACTED = "<redacted>"

# -- by value ------------------------------------------------------------------------------------

# The token shapes of common services, anywhere in a text.
TOKEN_SHAPES = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"gh[pousr]_[A-Za-z0-9]{20,}"                           # GitHub: personal, OAuth, user, server, refresh
    r"|github_pat_[A-Za-z0-9_]{20,}"                         # GitHub: fine-grained personal
    r"|xox[abposre]-[A-Za-z0-9-]{10,}|xapp-[A-Za-z0-9-]{10,}"   # Slack
    r"|(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}(?![0-9A-Z])"       # AWS access key ids
    r"|hf_[A-Za-z0-9]{30,}"                                 # Hugging Face (letters only too)
    r"|sk-[A-Za-z0-9_-]{20,}"                               # OpenAI, Anthropic (sk-ant-, sk-proj-)
    r"|[sr]k_(?:live|test)_[A-Za-z0-9]{16,}"                # Stripe
    r"|gl(?:pat|dt|ptt|rt|cbt|oas|ft|imt|soat)-[A-Za-z0-9_-]{20,}"   # GitLab
    r"|npm_[A-Za-z0-9]{36}|pypi-[A-Za-z0-9_-]{50,}"         # npm, PyPI
    r"|AIza[0-9A-Za-z_-]{35}|ya29\.[0-9A-Za-z_-]{20,}"      # Google API key, OAuth access token
    r"|dop_v1_[a-f0-9]{64}"                                 # DigitalOcean
    r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"   # a JWT
    r"|\d{6,12}:AA[A-Za-z0-9_-]{30,}"                       # a Telegram bot's token
    r")")
PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.S)
# A URL: its scheme and host (with any user:password@), then its path, query and fragment.
URL = re.compile(r"\b([A-Za-z][A-Za-z0-9+.\-]*://)([^\s/?#'\"]*)([/?#][^\s'\"]*)?")
# Whose path is itself the secret: a webhook (Slack, Discord, Teams, Google Chat, Zapier, IFTTT;
# and any URL with a hooks/webhook folder: Mattermost, Rocket.Chat, a CI's).
WEBHOOK_HOSTS = ("hooks.slack.com", "discord.com", "discordapp.com", "webhook.office.com", "outlook.office.com",
                 "chat.googleapis.com", "hooks.zapier.com", "maker.ifttt.com", "api.telegram.org")
WEBHOOK_FOLDERS = frozenset({"hooks", "hook", "webhook", "webhooks", "webhookb2", "trigger"})
# A signed URL's query keys whose value is the secret, whatever secret_name says of them: Azure's
# SAS `sig`, an OAuth `code` (a signature and a token name say it themselves: X-Amz-Signature).
QUERY_SECRETS = frozenset({"sig", "code", "sas"})
HEADER = re.compile(r"(?i)\b((?:proxy-)?authorization|x-api-key|x-auth-token)(\s*:\s*)"
                    r"(?:(bearer|basic|token|digest|negotiate)\s+)?[^\s'\"]+")
COOKIE_HEADER = re.compile(r"(?i)\b((?:set-)?cookie)(\s*:\s*)[^\r\n'\"]+")
BEARER = re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9\-._~+/]{8,}=*")
# Basic auth: base64 of user:password, after the word Basic (a header's own is HEADER's).
BASIC = re.compile(r"(?i)\b(basic)(\s+)([A-Za-z0-9+/]{4,}={0,2})(?![\w+/=])")
# curl's user:password (--user, -u, --proxy-user, -U): the password goes, the user stays.
USER_PASSWORD = re.compile(r"(?<![\w\-])(--user|--proxy-user|-u|-U)([ \t]+|=)([^\s:'\"]*):([^\s'\"]+)")
# A key with a secret name and its value in free text: a dict's repr ('password': 'X'), JSON
# ("api_key": "X", also escaped inside a JSON string), YAML (token: X), NAME = X. KEY is the name
# and its separator only, so that the text after a harmless key is still searched ({'db': {'pass':
# 'X'}}); VALUE is what a secret key's value is: a quoted text (to its closing quote or the line's
# end), a list or a flat object, or one word.
KEY = re.compile(r"""(?<![\w.\-])(-{0,2}[A-Za-z_][\w.\-]*)(\\?["'])?([ \t]*[:=][ \t]*)""")
VALUE = re.compile(r"""(?:[bBrRuU]{1,2}(?=\\?["']))?(\\?["'])(.*?)(?:\1|(?=\n)|\Z)|\[[^\[\]\n]*\]|\{[^{}\n]*\}"""
                   r"""|[A-Za-z_][\w.]*\((?:[^()\n]|\([^()\n]*\))*\)"""
                   r"""|[^\s,;&{}\[\]()'"\\][^\s,;&}\])'"\\]*""")
# Names that _key_values leaves alone: an exception's type (KeyError: 'x' is no key), and the headers
# HEADER and COOKIE_HEADER already hid (their scheme word stays: "Authorization: Basic <redacted>").
NOT_A_KEY = re.compile(r"(?:Error|Exception|Warning|Exit|Interrupt)$")
HEADER_NAMES = frozenset({"authorization", "proxy-authorization", "x-api-key", "x-auth-token", "cookie", "set-cookie"})
# A secret option and its value in a text (a command line quoted in a message): `--token X`.
OPTION_IN_TEXT = re.compile(r"(?<![\w\-])(--?[A-Za-z][\w.\-]*)([ \t]+)(\S+)")
PAIR = re.compile(r"(?<![\w.\-])(-{0,2}[A-Za-z_][\w.\-]*)=(\{[^}\n]*\}|[^\s;&,]+)")
OPTION = re.compile(r"--?[A-Za-z][\w.\-]*")
# The programs whose -p is a password: sshpass (`-p X`, `-pX`, before the command it runs, whose
# own -p is its own), the MySQL clients (`-pX` only: a bare -p asks, and the next word is a database).
PASSWORD_P = frozenset({"sshpass", "mysql", "mysqldump", "mysqladmin", "mariadb"})
SSHPASS_IN_TEXT = re.compile(r"\b(sshpass(?:\s+-[^p\s]\S*)*\s+-p)(\s*)(\S+)")
MYSQL_IN_TEXT = re.compile(r"\b((?:mysql|mysqldump|mysqladmin|mariadb)\b[^\n]*?\s-p)(?=\S)(\S+)")


KEPT_LENGTH = 256         # a text this short or shorter keeps its answer: a bundle of 4,096 ranks
KEPT_MAX = 65536          # holds the same frames and words thousands of times (issue 36)
_kept: dict[str, str] = {}


def redact_text(text: str) -> str:
    """The credentials inside a value or a line, whatever the variable holding it is called."""
    if len(text) > KEPT_LENGTH:
        return _redact_text(text)
    found = _kept.get(text)
    if found is None:
        if len(_kept) >= KEPT_MAX:
            _kept.clear()
        found = _kept[text] = _redact_text(text)
    return found


def _redact_text(text: str) -> str:
    text = PRIVATE_KEY.sub(REDACTED, text)
    text = TOKEN_SHAPES.sub(REDACTED, text)
    text = URL.sub(_url, text)
    text = USERINFO.sub(lambda m: f"{m.group(1)}:{REDACTED}@", text)
    text = SECRET_CALL.sub(_secret_call, text)
    text = HEADER.sub(lambda m: m.group(1) + m.group(2) + (f"{m.group(3)} " if m.group(3) else "") + REDACTED, text)
    text = COOKIE_HEADER.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
    text = BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    text = BASIC.sub(_basic, text)
    text = USER_PASSWORD.sub(lambda m: f"{m.group(1)}{m.group(2)}{m.group(3)}:{REDACTED}", text)
    text = SSHPASS_IN_TEXT.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
    text = MYSQL_IN_TEXT.sub(lambda m: m.group(1) + REDACTED, text)
    text = ATTACHED_P.sub(lambda m: "-p" + REDACTED if attached_p(m.group(0)) else m.group(0), text)
    text = _options_in_text(text)
    text = _key_values(text)
    return PAIR.sub(lambda m: f"{m.group(1)}={REDACTED}" if secret_pair(m.group(1), m.group(2))
                    and not m.group(2).startswith(REDACTED) else m.group(0), text)


def secret_pair(name: str, value: str) -> bool:
    """Is this NAME=VALUE's value a secret? By its name; and PWD's, unless it is the shell's folder
    (PWD=/home/me): in a connection string (UID=sa;PWD=X) it is the password."""
    if name.lstrip("-") == "PWD":
        return not value.startswith(("/", "~"))
    return secret_name(name)


def _key_values(text: str) -> str:
    """Each secret key's value hidden (KEY, VALUE); the keys inside a value hidden whole are not
    looked at again."""
    out, done = [], 0
    for key in KEY.finditer(text):
        if key.start() < done:
            continue
        name = key.group(1)
        if not (secret_name(name) or name.lstrip("-") == "PWD") or NOT_A_KEY.search(name) \
                or (":" in key.group(3) and name.lower() in HEADER_NAMES):
            continue                 # (asked first: a value is looked for after a secret name only)
        if not key.group(2) and ":" in key.group(3) and not _secret_key_in_prose(name):
            continue

        value = VALUE.match(text, key.end())
        if value is None:
            continue
        quote = value.group(1)
        said = value.group(2) if quote else value.group(0)
        if not said or said == REDACTED or not secret_pair(name, said):
            continue
        closed = quote if quote and value.group(0).endswith(quote) and len(value.group(0)) > len(quote) else ""
        prefix = text[value.start():value.start(1)] if quote else ""       # a bytes' b, a raw string's r
        out += [text[done:key.end()], f"{prefix}{quote or ''}{REDACTED}{closed}"]
        done = value.end()
    return "".join(out) + text[done:] if out else text


# A key's kinds that make `NAME_KEY: X` in prose a secret (api_key: X); any other KEY there is a
# store's or a dict's key (torch: "for key: store_based_barrier_key:1").
KEY_KINDS = frozenset({"API", "ACCESS", "SECRET", "PRIVATE", "CLIENT", "AUTH", "SIGNING", "ENCRYPTION", "SSH",
                       "LICENSE", "ACCOUNT", "STORAGE", "SERVICE", "APP", "DEPLOY", "MASTER", "SUBSCRIPTION",
                       "SHARED", "SESSION", "WANDB", "HF", "OPENAI"})


def _secret_key_in_prose(name: str) -> bool:
    """An unquoted `NAME: X` (YAML, a message): its name says secret by a word other than KEY, or
    by a KEY of a secret kind."""
    parts = [p.upper() for p in NAME_PARTS.findall(name)]
    if any(secret_part(p) for p in parts if p != "KEY"):
        return True
    return any(p == "KEY" and i > 0 and parts[i - 1] in KEY_KINDS for i, p in enumerate(parts))


def _basic(found: re.Match) -> str:
    """Basic auth's base64 hidden when it is one: it decodes to printable user:password."""
    word = found.group(3)
    try:
        decoded = base64.b64decode(word + "=" * (-len(word) % 4), validate=True)
    except (binascii.Error, ValueError):
        return found.group(0)
    if b":" in decoded and all(32 <= byte < 127 for byte in decoded):
        return f"{found.group(1)}{found.group(2)}{REDACTED}"
    return found.group(0)


def _url(found: re.Match) -> str:
    scheme, authority, rest = found.group(1), found.group(2), found.group(3) or ""
    if "@" in authority:             # user:password@host: up to the host's last @
        authority = f"{REDACTED}@{authority.rsplit('@', 1)[1]}"
    host = authority.rsplit("@", 1)[-1].split(":", 1)[0].lower()
    folders = {part.lower() for part in rest.split("?", 1)[0].split("/")}
    if rest and (host.endswith(WEBHOOK_HOSTS) or folders & WEBHOOK_FOLDERS):
        rest = "/" + REDACTED
    return scheme + authority + QUERY_PAIR.sub(_query_pair, rest)


# A query's or a fragment's key=value (?sv=2022&sig=X, #access_token=X).
QUERY_PAIR = re.compile(r"(?<=[?&#;])([^=&#;?/]+)=([^&#;]*)")


def _query_pair(found: re.Match) -> str:
    key, value = found.groups()
    if value and (key.lower() in QUERY_SECRETS or secret_name(key)):
        return f"{key}={REDACTED}"
    return found.group(0)


def _options_in_text(text: str) -> str:
    """Each secret option's value hidden (`--token X`); a hidden value that is itself a secret option
    (`--password --token X`: is --token the password, or an option of its own?) hides its own
    value too, so that neither reading shows a secret."""
    out, done, at = [], 0, 0
    while (found := OPTION_IN_TEXT.search(text, at)) is not None:
        option, _, value = found.groups()
        at = found.start(3)              # the value may be an option of its own
        if found.start(3) < done or value == REDACTED or not secret_name(option) \
                or (value.startswith("-") and not takes_secret_value(option)):
            continue
        out += [text[done:found.start(3)], REDACTED]
        done = at = found.end(3)
        while OPTION.fullmatch(value) and secret_name(value):
            after = NEXT_WORD.match(text, done)
            if after is None or after.group(2) == REDACTED \
                    or (after.group(2).startswith("-") and not takes_secret_value(value)):
                break
            out += [text[done:after.start(2)], REDACTED]
            done = at = after.end(2)
            value = after.group(2)
    return "".join(out) + text[done:] if out else text


NEXT_WORD = re.compile(r"([ \t]+)(\S+)")
# A value given to a short -p with no space (`-pMYSQLPASS`, mysql's way): hidden unless it is plainly a
# port or a folder (`-p2222`, `-p/data`): which program reads it is not known from a word.
ATTACHED_P = re.compile(r"(?<![\w\-])-p(?=[^\s=])([^\s'\"]+)")
# A user's password before an @ with no scheme (`admin:pw@db`, `MASTER_ADDR=u:pw@10.0.0.1`); a URL's
# is URL's. Not an e-mail (no colon, or mailto:'s) nor git's `git@host:org/x` (the colon after the @).
USERINFO = re.compile(r"(?<![\w.%+\-:/@<])(?!(?i:mailto|sips?|xmpp|im|pres):)([\w.%+\-]+):([^\s@/:'\"<>]+)@(?=[\w\[])")
# A value a class's repr holds when its name says secret (`SecretStr('X')`, `Password(b'X')`): the
# class says what it holds, whatever key it stands under.
SECRET_CALL = re.compile(r"(?<![\w.])([A-Z][\w]*)\(([^()\n]+)\)")


def _secret_call(found: re.Match) -> str:
    name, inside = found.groups()
    if not secret_name(name) or inside == REDACTED or inside.strip("'\"") == REDACTED:
        return found.group(0)
    return f"{name}({REDACTED})"


# A compiler's switches that start with -p (a build's log, pasted to explain): not a password.
COMPILER_P = frozenset({"-pthread", "-pipe", "-pedantic", "-pedantic-errors", "-pie", "-pg", "-pthreads"})


def attached_p(word: str) -> bool:
    """Is this word -p with a value attached that may be a password (`-pMYSQLPASS`, `-phunter2`)?
    Not a port or a folder (`-p2222`), nor a password option of its own (`-password`, `-passwd`)."""
    if not word.startswith("-p") or word.startswith("--") or len(word) == 2 or plain_value(word[2:]) \
            or word in COMPILER_P:
        return False
    parts = NAME_PARTS.findall(word[1:])
    return not (parts and parts[0].lower() != "p" and OPTION.fullmatch(word) and takes_secret_value(word))


def redact_env(env: dict) -> dict:
    """An environment to show: a value for a name known safe or plainly harmless (its credentials
    hidden too), and a plain value (a number, a yes or no, a folder) under any name that does not
    say secret (STEPS=100); `<redacted>` for every other."""
    return {name: redact_text(value) if isinstance(value, str) and shown_variable(name, value) else REDACTED
            for name, value in env.items()}


def redact_argv(argv: list) -> list:
    """A command line to show: the value after a secret option (`--token X`, `--password=X`,
    `--password -xSECRET`), sshpass's and mysql's -p, and credentials in any word. A secret
    switch followed by another option (`--no-auth --steps 3`) hides nothing."""
    out: list = []
    hide_next = None          # "any": the next word whatever it is; "value": unless it is an option
    password_p = None         # the program seen whose -p is a password
    for word in argv:
        word = str(word)
        if hide_next == "any" or (hide_next == "value" and not word.startswith("-")):
            out.append(REDACTED)
            # A hidden word that is itself a secret option (`--password --token X`): its value too.
            hide_next = ("any" if takes_secret_value(word) else "value") \
                if OPTION.fullmatch(word) and secret_name(word) else None
            continue
        hide_next = None
        program = word.rsplit("/", 1)[-1]
        if program in PASSWORD_P:
            password_p = program
        elif password_p and word.startswith("-p") and not word.startswith("--"):
            if word == "-p" and password_p == "sshpass":
                hide_next = "any"
            elif word != "-p":
                word = "-p" + REDACTED
            out.append(word)
            continue
        elif password_p == "sshpass" and not word.startswith("-"):
            password_p = None     # the command sshpass runs: its -p is its own (ssh -p PORT)
        if "=" not in word and attached_p(word):
            out.append("-p" + REDACTED)                  # -pMYSQLPASS: whose -p it is, a word does not say
            continue
        option, equals, _ = word.partition("=")
        if equals and OPTION.fullmatch(option) and secret_name(option):
            out.append(f"{option}={REDACTED}")           # the whole value, whatever it holds
            continue
        if OPTION.fullmatch(word) and secret_name(word):
            hide_next = "any" if takes_secret_value(word) else "value"
        elif out and out[-1] in USER_OPTIONS and ":" in word:     # --user admin:PASSWORD
            word = word.split(":", 1)[0] + ":" + REDACTED
        out.append(redact_text(word))
    return out


USER_OPTIONS = frozenset({"--user", "-u", "--proxy-user", "-U"})


def redact_json(value):
    """A JSON document to write: under a secret key, any value (text, number, list, object) hidden;
    every other text through redact_text. A null or a boolean says nothing and stays."""
    if isinstance(value, dict):
        return {key: REDACTED if secret_name(str(key)) and value_says_something(item) else redact_json(item)
                for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_json(item) for item in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def value_says_something(value) -> bool:
    return value is not None and not isinstance(value, bool)
