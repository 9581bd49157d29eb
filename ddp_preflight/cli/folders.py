"""Where each node's data, training code and Python are, from the arguments and the config."""

from __future__ import annotations

import os
from pathlib import Path


def data_dir_of_each(data_paths, config, names: list[str]) -> list[str | None]:
    """Each node's data folder, in host order: --data-dir NODE:PATH, else --data-dir PATH, else the
    config's for that node ([nodes.NAME] data_dir, else the top-level one)."""
    return [data_paths.nodes.get(h) or data_paths.every or config.for_node(h, "data_dir") for h in names]


def code_dir_of(launch_args: list[str]) -> str | None:
    """The folder of the training script, or this folder for `-m module`."""
    if not launch_args:
        return None
    if "-m" in launch_args or "--module" in launch_args:
        return os.getcwd()
    script = next((a for a in launch_args if not a.startswith("-")), None)
    if script and Path(script).exists():
        return str(Path(script).resolve().parent)
    return None


def pythons_given(args, hosts: list[str]):
    """--python PATH (every node) and --python NODE:PATH (that node), checked before any node is
    contacted, as --data-dir is (ddp_preflight.preflight.hosts.HostListError when one names no host)."""
    from ddp_preflight.preflight.hosts import node_paths

    given = args.python if isinstance(args.python, list) else [args.python] if args.python else []
    return node_paths("--python", given, hosts, what="Python")


def python_of(args, config, host: str):
    """The training's Python on `host` (rules/python.py): --python NODE:PATH, else --python PATH,
    else the config's for that node, else this interpreter's; the same answer for the facts, the
    probes and the launch."""
    from ddp_preflight.rules.python import training_python

    paths = getattr(args, "python_paths", None)
    given = paths.of(host) if paths is not None else args.python if isinstance(args.python, str) else None
    return training_python(given, config.for_node(host, "python"))
