"""The variables the training gets on top of each node's own environment, and where each came
from: the config's [env] and [nodes.NAME.env], then --env NAME=VALUE and --env NODE:NAME=VALUE.

Later layers win: the command line over the config, one node's setting over every node's. The
same settings reach preflight (the facts are collected with them, the probes run with them) and
the launch (launch/plan.py), so the checks judge the environment the ranks will get."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Where a setting was given, lowest precedence first.
CONFIG_ALL, CONFIG_NODE, ARG_ALL, ARG_NODE = range(4)


class EnvError(ValueError):
    """A setting that cannot be used: one line naming it (never its value) and the fix."""


@dataclass(frozen=True)
class Setting:
    name: str
    value: str
    node: str | None          # None: every node
    layer: int                # CONFIG_ALL ... ARG_NODE

    @property
    def source(self) -> str:
        """Where it was given, in the words the user typed it with."""
        return {CONFIG_ALL: "config [env]", CONFIG_NODE: f"config [nodes.{self.node}.env]",
                ARG_ALL: "--env", ARG_NODE: f"--env {self.node}:"}[self.layer]


@dataclass(frozen=True)
class TrainingEnv:
    settings: tuple[Setting, ...] = ()
    config_path: str | None = None     # the --config file the config layers came from

    def setting(self, node: str, name: str) -> Setting | None:
        """The setting of `name` that wins on `node`; None when nothing was given for it."""
        found = None
        for s in sorted(self.settings, key=lambda s: s.layer):     # stable: the last one given wins
            if s.name == name and s.node in (None, node):
                found = s
        return found

    def for_node(self, node: str) -> dict[str, str]:
        """NAME -> value, as the training on `node` gets them."""
        names = dict.fromkeys(s.name for s in self.settings if s.node in (None, node))
        return {name: found.value for name in names if (found := self.setting(node, name)) is not None}

    def sources(self, node: str) -> dict[str, str]:
        """NAME -> where the winning value was given, for `node`."""
        names = dict.fromkeys(s.name for s in self.settings if s.node in (None, node))
        return {name: found.source for name in names if (found := self.setting(node, name)) is not None}

    def __bool__(self) -> bool:
        return bool(self.settings)


def check_name(name: str, where: str) -> None:
    if not ENV_NAME.match(name):
        # The value may be a secret: the message names the variable only.
        raise EnvError(f"{where}: {name!r} is not a variable name (letters, digits and _, not starting with a digit)")


def parse_env_args(pairs: Sequence[str], hosts: Iterable[str] | None = None) -> list[Setting]:
    """--env NAME=VALUE (every node) and --env NODE:NAME=VALUE (that node), repeatable.

    What comes before the first '=' decides: a variable name has no ':', so `NODE:NAME` names a
    node, and the value may hold anything, ':' and '=' included (--env URL=http://h:80/?a=b).
    A host that has ':' itself (an IPv6 address) is split at its last ':'. `hosts`: the node
    names a NODE: prefix may use (None: not checked here)."""
    known = list(hosts) if hosts is not None else None
    out = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise EnvError(f"--env {pair!r} has no '=': write "
                           "--env NAME=VALUE for every node or --env NODE:NAME=VALUE for one "
                           "(e.g. --env worker1:NANOCHAT_DTYPE=float32)")
        node, colon, name = key.rpartition(":")
        if colon and not node:
            raise EnvError(f"--env {key}=...: no node before ':': write --env NODE:NAME=VALUE "
                           "(e.g. --env worker1:NANOCHAT_DATA_DIR=/data/small)")
        check_name(name, f"--env {key}=...")
        if colon and known is not None and node not in known:
            raise EnvError(f"--env {key}=...: {node} is not one of the hosts ({', '.join(known) or 'none given'}): "
                           "name a host of this run before the ':'")
        out.append(Setting(name, value, node if colon else None, ARG_NODE if colon else ARG_ALL))
    return out


def from_config(every: Mapping[str, str], per_node: Mapping[str, Mapping[str, str]]) -> list[Setting]:
    """The config's [env] and [nodes.NAME.env] tables (already checked by ddp_preflight/preflight/config.py)."""
    out = [Setting(name, value, None, CONFIG_ALL) for name, value in every.items()]
    for node, env in per_node.items():
        out += [Setting(name, value, node, CONFIG_NODE) for name, value in env.items()]
    return out
