"""Run a command inside a lab node: its network namespace, hostname and data folder."""

from __future__ import annotations

from .state import LabState, Node

# `ip netns exec` gives a private mount namespace with /etc/netns/NODE/* bound over /etc;
# unshare adds the node's own hostname; the node's data folder is mounted at the lab's
# data path, so the path is the same on every node while the contents are the node's own.
_WRAPPER = 'hostname "$1" && mount --bind "$2" "$3" && shift 3 && exec "$@"'


def in_node(state: LabState, node: Node, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", node.netns, "unshare", "--uts", "--", "sh", "-c", _WRAPPER,
            "sh", node.name, str(state.node_dir(node.name) / "data"), str(state.data_dir), *argv]
