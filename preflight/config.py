"""The TOML config: defaults for every node, and per-node overrides under [nodes.NAME]."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

NODE_KEYS = {"python", "data_dir", "code_dir"}
TOP_KEYS = NODE_KEYS | {"hosts", "backend", "device", "master_port", "master_addr", "nproc_per_node",
                        "ssh_config", "nodes"}


class ConfigError(Exception):
    pass


@dataclass(frozen=True)
class Config:
    values: dict = field(default_factory=dict)
    nodes: dict = field(default_factory=dict)     # name -> {python, data_dir, code_dir}

    def for_node(self, name: str, key: str, default=None):
        return self.nodes.get(name, {}).get(key, self.values.get(key, default))


def load(path: str | None) -> Config:
    if not path:
        return Config()
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config {path} does not exist") from None
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
    return Config(raw, nodes)
