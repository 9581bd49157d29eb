"""What the path-MTU probe saw, as typed data: each direction of each pair of nodes, with the
largest don't-fragment packet that passed and both ends' MTUs. The probe's JSON
(preflight/probes/path_mtu.py) stays the wire and the recording; path-mtu judges these fields,
and the bandwidth probe reads them to stay off a path that drops large packets."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class Direction:
    """From `src` to `dst`'s echo; `outcome` as node/pathmtu.py names it: fits (the route's full
    size passed), learned (a hop said a smaller size with ICMP), blackhole (larger packets vanish,
    nothing said), blocked-here (src's own firewall refused a size: EPERM on send), unanswered, error."""
    src: str
    dst: str
    outcome: str
    passed: int | None              # bytes: the largest packet that passed
    route_mtu: int | None           # bytes: what the kernel's route lets src send
    src_interface: str | None = None
    src_mtu: int | None = None
    dst_interface: str | None = None
    dst_mtu: int | None = None
    address: str | None = None      # dst's echo
    port: int | None = None
    detail: str | None = None
    port_refused: bool = False      # ICMP port unreachable: nothing listened at the echo
    sent: Mapping[str, Any] = field(default_factory=dict, compare=False)
    blocked: int | None = None      # bytes: the smallest packet src's own firewall refused (EPERM on send)

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> Direction:
        return cls(wire["src"], wire["dst"], wire["outcome"], wire.get("passed"), wire.get("route_mtu"),
                   wire.get("src_interface"), wire.get("src_mtu"), wire.get("dst_interface"), wire.get("dst_mtu"),
                   wire.get("address"), wire.get("port"), wire.get("detail"), bool(wire.get("port_refused")),
                   MappingProxyType(dict(wire)), wire.get("blocked"))

    @property
    def src_end_mtu(self) -> int | None:
        """src's MTU: its interface's, else its route's."""
        return self.src_mtu or self.route_mtu

    @property
    def tcp_packet(self) -> int:
        """The largest packet TCP sends from src to dst: the smaller of the two ends' MTUs."""
        return min(m for m in (self.route_mtu, self.dst_mtu) if m)

    @property
    def hangs(self) -> bool:
        """TCP's own packets from src to dst are larger than what passes: a black hole."""
        return self.outcome == "blackhole" and self.passed is not None and self.tcp_packet > self.passed

    def to_json(self) -> dict:
        return dict(self.sent)


@dataclass(frozen=True)
class PathMtuSeen:
    directions: tuple[Direction, ...]
    errors: Mapping[str, str]           # node -> why its part of the probe did not run
    seconds: float | None

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> PathMtuSeen:
        return cls(tuple(Direction.from_json(p) for p in wire.get("pairs", ())), dict(wire.get("errors", {})),
                   wire.get("seconds"))

    def blackholes(self) -> list[Direction]:
        """The directions where large TCP segments vanish (for the probes that move large messages):
        on the way, or in the sender's own firewall."""
        return [d for d in self.directions if d.hangs or d.outcome == "blocked-here"]

    def back(self, d: Direction) -> Direction | None:
        """The other direction of the same pair, when it too is a black hole."""
        return next((b for b in self.directions if b.src == d.dst and b.dst == d.src and b.passed
                     and b.outcome == "blackhole"), None)
