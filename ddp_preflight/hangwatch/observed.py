"""What the evidence shows of one rank, as Evidence holds it: an exception seen (in its own record
or its output), and where it is in each process group's sequence of collectives. Plain data,
part of hangwatch/model.py's model (which re-exports both)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Seen:
    """An exception as the evidence shows it: the rank's own record (node/rank_bootstrap.py) or its
    output (hangwatch/tracebacks.py)."""
    type: str
    message: str
    where: str | None = None          # the training's own line that raised it: "train.py:40"
    function: str | None = None
    lost_peer: bool = False           # a message of a rank that lost a peer or the link
    peer: str | None = None           # the peer's address when the message names it
    source: str = "output"            # "record" (the rank wrote it) | "output" (read in its lines)
    cause: str | None = None          # the chain's earlier exception, when it said more (a wrapper's ValueError
                                      # raised from Gloo's timeout): what its words name is read from both
    failure: str | None = None        # its message's id in the one catalogue (rules/failures.py); None: not there


@dataclass(frozen=True)
class InGroup:
    """Where a rank is in one process group's sequence of collectives (its Flight Recorder):
    sequence numbers count per group, so only a group's own are compared."""
    group: str                        # the group's id: torch's pg name ("0": the default group)
    seq: int                          # the last collective it entered in that group
    op: str | None = None
    completed: int | None = None
    last: bool = False                # its last collective of all is this group's: where it waits
    ranks: tuple[int, ...] = ()       # its members, where the dump lists them (NCCL); () when not known
