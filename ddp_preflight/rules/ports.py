"""Who holds a port: the fix when something not known here listens on the master port
(master-port; `ddp-preflight explain` on EADDRINUSE)."""

from __future__ import annotations

from .fix import Fix, run


def who_holds(node: str, port: int | str) -> Fix:
    """See which process holds the port, on the node that has it; or take another port."""
    return run(f"sudo ss -ltnp 'sport = :{port}'", node, f"on {node}, to see who; or use --master-port")
