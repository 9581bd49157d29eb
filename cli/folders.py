"""Where each node's data and training code are, from the arguments and the config."""

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
