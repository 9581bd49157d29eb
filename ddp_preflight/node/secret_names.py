"""Which names say they hold a secret, which say they hold none, and which values say nothing
secret whatever their name: the rules by name of node/redact.py (its docstring says them in the
user's words). Pure, standard library only."""

from __future__ import annotations

import functools
import re

# -- by name -------------------------------------------------------------------------------------

# A name's parts: split at _ - . and where lower case turns upper (apiKey); digits apart.
NAME_PARTS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
# Words that name a value which is itself the secret: an option with one always takes a value.
VALUE_PARTS = frozenset({
    "TOKEN", "SECRET", "SECRETS", "PASS", "PASSWD", "PASSWORD", "PASSWORDS", "PASSPHRASE", "PWD", "PW",
    "PASSCODE", "KEY", "APIKEY", "CREDENTIAL", "CREDENTIALS", "CREDS", "PAT", "SIG", "SAS", "BEARER"})
SECRET_PARTS = VALUE_PARTS | frozenset({
    "AUTH", "AUTHORIZATION", "COOKIE", "COOKIES", "SESSION", "SIGNATURE"})
# Parts written as one word with a prefix: PGPASSWORD, ACCESSTOKEN, CLIENTSECRET, OPENAIAPIKEY,
# SSHPASS. (KEY alone is not a suffix: MONKEY, HOCKEY; nor PASS in the English words below.)
SECRET_SUFFIXES = ("PASSWORD", "PASSWD", "PASSPHRASE", "TOKEN", "SECRET", "APIKEY", "ACCESSKEY", "PRIVATEKEY",
                   "PASS")
NOT_A_PASS = frozenset({"BYPASS", "COMPASS", "ENCOMPASS", "SURPASS", "TRESPASS", "OVERPASS", "UNDERPASS",
                        "MULTIPASS", "ONEPASS", "TWOPASS", "SINGLEPASS", "FIRSTPASS", "SECONDPASS"})
# An option that starts so is a switch, not a holder of a value: --no-auth, --use-auth-token.
SWITCH_WORDS = frozenset({"NO", "USE", "DISABLE", "ENABLE", "WITH", "WITHOUT", "SKIP", "ASK", "PROMPT",
                          "REQUIRE", "ALLOW", "IGNORE", "FORCE", "SHOW", "PRINT", "CHECK", "VERIFY"})


def secret_part(part: str) -> bool:
    return part in SECRET_PARTS or (part.endswith(SECRET_SUFFIXES) and part not in NOT_A_PASS)


@functools.lru_cache(maxsize=4096)      # a bundle asks of the same few keys for every rank (issue 36)
def secret_name(name: str) -> bool:
    """Does this name say it holds a secret? (HF_TOKEN, MY_PASS, SSHPASS, GH_PAT, --api-key: yes.)"""
    if name == "PWD":                # the shell's current folder, not a password (--pwd, pwd= are)
        return False
    return any(secret_part(p.upper()) for p in NAME_PARTS.findall(name))


def takes_secret_value(option: str) -> bool:
    """A secret option whose next word is its value even when that word starts with '-'
    (`--password -xSECRET`): a password, token or key option that is not a switch (`--no-auth`)."""
    parts = [p.upper() for p in NAME_PARTS.findall(option)]
    if not parts or parts[0] in SWITCH_WORDS:
        return False
    return any(p in VALUE_PARTS or (p.endswith(SECRET_SUFFIXES) and p not in NOT_A_PASS) for p in parts)


# -- which environment values may be shown -------------------------------------------------------------

SAFE_NAMES = frozenset({
    "PATH", "LD_LIBRARY_PATH", "LIBRARY_PATH", "LD_PRELOAD", "CPATH", "PYTHONPATH", "MANPATH", "PKG_CONFIG_PATH",
    "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TZ", "PWD", "OLDPWD", "HOSTNAME", "TMPDIR",
    "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "CONDA_EXE", "CONDA_PYTHON_EXE", "CONDA_SHLVL",
    "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
    "ROLE_NAME", "ROLE_WORLD_SIZE", "NODE_RANK", "NNODES", "NPROC_PER_NODE",
    "TOKENIZERS_PARALLELISM", "DTYPE", "COMPUTE_DTYPE", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
})
SAFE_PREFIXES = (
    "CUDA_", "NCCL_", "GLOO_", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "TORCH_", "TORCHELASTIC_", "TORCHINDUCTOR_",
    "TORCHDYNAMO_", "PYTORCH_", "MASTER_", "NVIDIA_", "CUDNN_", "CUBLAS_", "NANOCHAT_", "TP_", "DTYPE",
    "COMPUTE_DTYPE", "PYTHON", "LC_", "SLURM_", "UCX_", "FI_", "HIP_", "ROCR_", "HSA_", "MIOPEN_", "XLA_",
    "HANGWATCH_", "DDP_PREFLIGHT_",
)


def safe_name(name: str) -> bool:
    """May this variable's value be shown? Only a setting known to be harmless, never a name that
    says secret (TORCH_SOMETHING_TOKEN is hidden)."""
    return (name in SAFE_NAMES or name.startswith(SAFE_PREFIXES)) and not secret_name(name)


# Values that say nothing secret whatever their name: a number, a yes or no, a folder.
PLAIN_VALUE = re.compile(r"[+-]?(?:\d{1,16}(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
                         r"|(?i:true|false|yes|no|on|off|none|null|auto)"
                         r"|(?:/|\./|\.\./|~/)[\w./+\-]*")


def plain_value(value: str) -> bool:
    return PLAIN_VALUE.fullmatch(value) is not None


def shown_variable(name: str, value: str) -> bool:
    if secret_name(name):
        return False
    return safe_name(name) or harmless_name(name) or plain_value(value)


# The words of a training's own settings, which name no secret: a name made of them only is shown
# (BATCH_SIZE, NUM_WORKERS, LOG_LEVEL, RUN_NAME), its credentials hidden still.
HARMLESS_PARTS = frozenset({
    "STEP", "STEPS", "EPOCH", "EPOCHS", "BATCH", "SIZE", "LR", "SEED", "NUM", "WORKERS", "MAX", "MIN", "ITER",
    "ITERS", "ITERATIONS", "INTERVAL", "EVAL", "SAVE", "LOG", "LEVEL", "DEBUG", "VERBOSE", "DIR", "FILE", "MODEL",
    "DATA", "DATASET", "CHECKPOINT", "CKPT", "OUTPUT", "OUT", "WARMUP", "DEPTH", "WIDTH", "HIDDEN", "LAYERS",
    "HEADS", "DIM", "DROPOUT", "DEVICE", "DEVICES", "BACKEND", "THREADS", "GRAD", "ACCUM", "CLIP", "WEIGHT",
    "DECAY", "MOMENTUM", "EPS", "SEQ", "LEN", "LENGTH", "VOCAB", "PRECISION", "AMP", "MODE", "RUN", "NAME",
    "EXPERIMENT", "PROJECT", "CONFIG", "COMPILE", "PER", "GPU", "CPU", "NODE", "NODES", "TOTAL", "TRAIN", "VAL",
    "TEST", "SPLIT", "SHARDS", "SHARD", "LOSS", "SCALE", "RATE", "LEARNING", "FP16", "BF16", "TF32"})


def harmless_name(name: str) -> bool:
    parts = [p.upper() for p in NAME_PARTS.findall(name)]
    return bool(parts) and all(p in HARMLESS_PARTS or p.isdigit() for p in parts)
