"""What the dashboard reads and asks of a run: the live watcher, a launched run, or recorded
snapshots."""

from __future__ import annotations

from .model import Snapshot


class Source:
    """What the dashboard reads and asks: implemented by the live watcher (hangwatch/watch.py)
    and, in tests and benches, by recorded snapshots. Every method returns at once; work
    happens in the source's own threads."""

    launched: bool = False            # True: quitting may stop the training it started

    def snapshot(self) -> Snapshot:
        raise NotImplementedError

    def dump_stacks(self) -> None:
        """Take every rank's stack now (the next snapshot has them)."""

    def write_bundle(self) -> str | None:
        """Write an incident bundle now; its path."""
        return None

    def log(self, node: str, rank: int | None = None, lines: int = 200) -> list[str]:
        """The last output lines of a rank (or a node's whole log)."""
        return []

    def stop(self) -> None:
        """Stop the training this source launched (no-op when attached)."""
