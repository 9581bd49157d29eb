"""The TOML config: defaults for every node, and per-node overrides under [nodes.NAME].

    python = "/opt/venv/bin/python"
    [env]                                  # the training's variables on every node
    NANOCHAT_DTYPE = "float32"
    [nodes.worker1]
    data_dir = "/data/small"
    [nodes.worker1.env]                    # ... and on worker1 only (wins over [env])
    NANOCHAT_DATA_DIR = "/data/small"
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from ddp_preflight.node.bounded import Skipped, read_regular
from ddp_preflight.rules.training_env import ENV_NAME

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CONFIG_BYTES = 1 << 20      # a config of a few nodes is a few KB: a FIFO or a huge file there is not one
NODE_KEYS = {"python", "data_dir", "code_dir", "env"}
TOP_KEYS = NODE_KEYS | {"hosts", "backend", "device", "master_port", "master_addr", "nproc_per_node",
                        "ssh_config", "nodes"}


class ConfigError(Exception):
    pass


@dataclass(frozen=True)
class Config:
    values: dict = field(default_factory=dict)
    nodes: dict = field(default_factory=dict)     # name -> {python, data_dir, code_dir, env}
    path: str | None = None

    @property
    def env(self) -> dict[str, str]:
        """[env]: the training's variables on every node."""
        return dict(self.values.get("env") or {})

    @property
    def node_env(self) -> dict[str, dict[str, str]]:
        """[nodes.NAME.env]: the training's variables on one node."""
        return {name: dict(table["env"]) for name, table in self.nodes.items() if table.get("env")}

    def for_node(self, name: str, key: str, default=None):
        return self.nodes.get(name, {}).get(key, self.values.get(key, default))


def load(path: str | None) -> Config:
    if not path:
        return Config()
    refused = owner_refusal(path)
    if refused is not None:
        raise ConfigError(refused)
    try:
        raw = tomllib.loads(read_regular(path, CONFIG_BYTES).decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config {path} does not exist") from None
    except Skipped as exc:
        raise ConfigError(f"config {path} is not read: {exc}; give a TOML file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config {path} is not valid TOML: it is not UTF-8 text") from None
    except OSError as exc:
        raise ConfigError(f"config {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config {path} is not valid TOML: {exc}") from None
    unknown = sorted(set(raw) - TOP_KEYS)
    if unknown:
        raise ConfigError(f"config {path}: unknown key {unknown[0]!r} (known: {', '.join(sorted(TOP_KEYS))})")
    nodes = raw.pop("nodes", {})
    if not isinstance(nodes, dict):
        raise ConfigError(f"config {path}: [nodes] must be a table of [nodes.NAME] tables")
    for name, table in nodes.items():
        if not isinstance(table, dict):
            raise ConfigError(f"config {path}: [nodes.{name}] must be a table")
        bad = sorted(set(table) - NODE_KEYS)
        if bad:
            raise ConfigError(f"config {path}: [nodes.{name}] has unknown key {bad[0]!r} "
                              f"(per-node keys: {', '.join(sorted(NODE_KEYS))})")
    if "hosts" in raw and not (isinstance(raw["hosts"], list) and all(isinstance(h, str) for h in raw["hosts"])):
        raise ConfigError(f"config {path}: hosts must be a list of host names")
    if "env" in raw:
        raw["env"] = _env_table(path, "[env]", raw["env"])
    for name, table in nodes.items():
        if "env" in table:
            table["env"] = _env_table(path, f"[nodes.{name}.env]", table["env"])
    return Config(raw, nodes, path)


def owner_refusal(path: str) -> str | None:
    """Why the config may not be read, or None: its [env], python and hosts decide what runs, as
    root too, so it and every folder above it (links resolved) must be root's or this user's and
    writable by no one else (node/trust.py's walk, as for the training's Python and PYTHONPATH)."""
    import os

    from ddp_preflight.node.loader_env import fix_command
    from ddp_preflight.node.trust import mode_words, user_name, walk

    refused = walk(path) if os.path.lexists(path) else None
    if refused is None:
        return None
    me = user_name(os.geteuid())
    if refused.why == "owner":
        why = f"belongs to {refused.owner()} (uid {refused.uid})"
    else:
        why = f"is writable by other users (mode {mode_words(refused.mode)})"
    said = f"it {why}" if refused.path == os.path.abspath(path) else f"{refused.path} {why}"
    return (f"config {path} is refused: {said}, who could change what runs as {me} (its [env], python and hosts): "
            f"{fix_command(refused)}, or give a config that only {'root' if me == 'root' else f'root or {me}'} "
            "can change")


def _env_table(path: str, where: str, table) -> dict[str, str]:
    """NAME = "value" pairs; a whole number is written as the variable would hold it (8 -> "8")."""
    if not isinstance(table, dict):
        raise ConfigError(f"config {path}: {where} must be a table of NAME = \"value\" pairs")
    out = {}
    for name, value in table.items():
        if not ENV_NAME.match(name):
            raise ConfigError(f"config {path}: {where} has {name!r}, not a variable name "
                              "(letters, digits and _, not starting with a digit)")
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            # The value may be a secret: the message names the variable and its kind only.
            raise ConfigError(f"config {path}: {where} {name} must be a string (write {name} = \"...\"), "
                              f"not a {type(value).__name__}")
        out[name] = str(value)
    return out
