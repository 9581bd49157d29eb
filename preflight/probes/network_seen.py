"""What the network probe saw, as typed data: each connection it tried, each node's listener,
the master port's listener. The probe's JSON (preflight/probes/network.py) stays the wire and
the recording; checks read these fields (master-reachable, ephemeral-ports, and the likely
causes of a failed job). A part a check puts in its details whole keeps the JSON as it came
(`sent`), so the report shows the probe's own words."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


class DialKind(str, enum.Enum):
    LISTENER = "listener"      # one of the ports the node's listener holds (as Gloo's would)
    CLOSED = "closed"          # a port nothing listens on: refused when no firewall is in the way
    MASTER = "master"          # the master port, dialled by a worker as its ranks will


@dataclass(frozen=True)
class Dial:
    """One connection tried from `src` to `dst`'s address and port; its outcome as
    node/netprobe.py names it: open, open-unverified, filtered, refused, rejected, unreachable, error."""
    src: str
    dst: str
    port: int
    kind: DialKind
    outcome: str
    detail: str | None = None
    sent: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> Dial:
        return cls(wire["src"], wire["dst"], int(wire["port"]), DialKind(wire["kind"]), wire["outcome"],
                   wire.get("detail"), MappingProxyType(dict(wire)))

    @property
    def blocks(self) -> bool:
        """It shows the path blocked: a listening port not opened, or the free port dropped or
        rejected instead of refused."""
        return (self.kind is DialKind.LISTENER and self.outcome != "open") or \
               (self.kind is DialKind.CLOSED and self.outcome in ("filtered", "rejected"))

    def to_json(self) -> dict:
        return dict(self.sent)


@dataclass(frozen=True)
class Listener:
    """A node's listener: the address the ranks will bind, the kernel's ephemeral range, the
    ports it held (None: it never listened), how many connections it turned away, and how many
    packets the node's reverse-path filter dropped while it listened (None: not counted)."""
    address: str | None
    interface: str | None
    range: tuple[int, int]
    ports: tuple[int, ...] | None
    rejected: int = 0
    rp_filter_drops: int | None = None

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> Listener:
        low, high = wire["range"]
        ports = wire.get("ports")
        drops = wire.get("rp_filter_drops")
        return cls(wire.get("address"), wire.get("interface"), (int(low), int(high)),
                   None if ports is None else tuple(int(p) for p in ports), int(wire.get("rejected", 0)),
                   drops if isinstance(drops, int) and not isinstance(drops, bool) else None)


@dataclass(frozen=True)
class MasterListener:
    """The master port's listener on the master: the address the workers dial, or why it could
    not listen."""
    address: str | None
    port: int | None
    error: str | None

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> MasterListener:
        return cls(wire.get("address"), wire.get("port"), wire.get("error"))


@dataclass(frozen=True)
class NetworkSeen:
    dials: tuple[Dial, ...]
    listeners: Mapping[str, Listener]
    master: MasterListener | None        # None: one node, no worker dials the master
    errors: Mapping[str, str]            # node -> why its part of the probe did not run
    nproc_per_node: int

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> NetworkSeen:
        master = wire.get("master") or None
        return cls(tuple(Dial.from_json(p) for p in wire.get("pairs", ())),
                   {name: Listener.from_json(one) for name, one in wire.get("listeners", {}).items()},
                   None if master is None else MasterListener.from_json(master),
                   dict(wire.get("errors", {})), int(wire.get("nproc_per_node", 2)))

    def blocked(self, names: set[str]) -> list[Dial]:
        """The dials between these nodes that found the path blocked: a listener's port (as Gloo's
        would be) not opened, a free port dropped or rejected, the master port not reached."""
        return [d for d in self.dials if d.src in names and d.dst in names and
                (d.blocks or d.kind is DialKind.MASTER and d.outcome not in ("open", "open-unverified"))]

    def into(self, dst: str, own: bool) -> list[Dial]:
        """The dials into `dst`'s listener: from the other nodes, or (own) from itself."""
        return [d for d in self.dials if d.dst == dst and (d.src == dst) == own and d.kind is not DialKind.MASTER]
