"""The training command's imports, resolved by this node's training Python (this process's) from
the folder the launch will start in (node/placement.py), with the training's variables: which
are missing here. The scan itself runs in a child (node/facts/import_scan.py, by its source) so
that sys.path is the rank's, not this program's."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

from .. import loader_env, trust
from ..loader_env import code_refusal
from ..placement import placement
from . import import_scan

TIMEOUT = 60.0       # seconds: hundreds of files parse in well under one


def entry_of(launch_args: list[str]) -> tuple[str, bool] | None:
    """(script or module, is a module) as torchrun on this node parses the command; by its first
    words where this Python has no torch (the command is then checked all the same)."""
    from .launch import torchrun_parse

    parsed = torchrun_parse(launch_args, 1, 1) or {}
    if parsed.get("parsed"):
        if parsed.get("no_python"):
            return None
        return parsed["training_script"], bool(parsed.get("module"))
    if launch_args[:1] in (["-m"], ["--module"]) and len(launch_args) > 1:
        return launch_args[1], True
    if launch_args and not launch_args[0].startswith("-"):
        return launch_args[0], False
    return None


def training_imports(request: dict) -> dict | None:
    """request: launch_args, launch_cwd (the folder ddp-preflight runs in on the master),
    master_code_dir, code_dir (this node's). None without a training command."""
    args = list(request.get("launch_args") or [])
    if not args or not request.get("launch_cwd"):
        return None
    found = entry_of(args)
    if found is None:
        return {"python": sys.executable, "skipped": "the command runs no Python script or module (--no-python)"}
    script, module = found
    folder, entry = placement(script, module, request["launch_cwd"], request.get("master_code_dir"),
                              request.get("code_dir"))
    folder, entry = os.path.expanduser(folder), entry if module else os.path.expanduser(entry)
    out = {"python": sys.executable, "entry": entry, "module": module, "root": folder}
    if not os.path.isdir(folder):
        return {**out, "entry_error": f"the folder {folder} does not exist here"}
    # The rank imports from the training's PYTHONPATH (this program's environment holds the
    # training's variables): only once no other user can change any of its folders. The scan
    # itself starts with -I, as every Python a node program starts (trust.python_argv), so it is
    # handed the walked folders to look in, after the start folder, as the rank has them.
    refused = loader_env.refusal(os.environ, folder)
    if refused is not None:
        return {"error": refused[0]}
    # The code itself: its folder (first on sys.path), the script, what they import at their top.
    refused = code_refusal(folder, None if module else entry)
    if refused is not None:
        return {"error": f"{refused[0]}; fix: {refused[1]}"}
    path = trust.path_entries(os.environ, "PYTHONPATH", folder)
    try:
        # The scan's own imports come from the interpreter, never from the project's folder it runs in.
        done = subprocess.run(trust.python_argv(sys.executable, inspect.getsource(import_scan)),
                              input=json.dumps({"entry": entry, "module": module, "path": path,
                                                "safe_path": bool(os.environ.get("PYTHONSAFEPATH"))}),
                              cwd=folder, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"error": f"the import scan did not finish within {TIMEOUT:g} s"}
    except OSError as exc:
        return {"error": f"could not start {sys.executable}: {exc.strerror}"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])[-400:]
        return {"error": f"the import scan failed (exit {done.returncode}): {tail or 'no output'}"}
    return json.loads(lines[-1])
