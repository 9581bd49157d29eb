"""Where the training starts on a node, and the script's path there: one rule for the launch
(launch/plan.py) and for what preflight checks on the node (node/facts/imports.py).

Every node starts in the folder ddp-preflight runs in on the master (the same path); a node whose
code folder is configured elsewhere starts there, with the script's path moved from the master's
code folder to the node's. Pure, standard library only."""

from __future__ import annotations

import posixpath


def placement(script: str, module: bool, cwd: str, master_code: str | None,
              node_code: str | None) -> tuple[str, str]:
    """(folder to start in, script path or module name) on one node. `cwd`: the folder
    ddp-preflight runs in on the master."""
    if not module and not posixpath.isabs(script):
        script = posixpath.normpath(posixpath.join(cwd, script))
    if not node_code or not master_code or posixpath.normpath(node_code) == posixpath.normpath(master_code):
        return cwd, script
    if module:
        return node_code, script
    inside = posixpath.relpath(script, master_code)
    if inside.startswith(".."):
        return node_code, script
    return node_code, posixpath.join(node_code, inside)
