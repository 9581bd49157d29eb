"""What the network probe saw, as typed data: each connection it tried, each node's listener,
the master port's listener. The probe's JSON (preflight/probes/network.py) stays the wire and
the recording; checks read these fields (master-reachable, ephemeral-ports, and the likely
causes of a failed job). A part a check puts in its details whole keeps the JSON as it came
(`sent`), so the report shows the probe's own words."""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ddp_preflight.rules.facts import Route


class DialKind(str, enum.Enum):
    LISTENER = "listener"      # one of the ports the node's listener holds (as Gloo's would)
    CLOSED = "closed"          # a port nothing listens on: refused when no firewall is in the way
    MASTER = "master"          # the master port, dialled by a worker as its ranks will


@dataclass(frozen=True)
class Dial:
    """One connection tried from `src` to `dst`'s address and port; its outcome as
    node/netprobe.py names it: open, open-unverified, filtered, refused, rejected, unreachable, error;
    and `src`'s own route to that address (None: an older node that did not say)."""
    src: str
    dst: str
    port: int
    kind: DialKind
    outcome: str
    detail: str | None = None
    sent: Mapping[str, Any] = field(default_factory=dict, compare=False)
    route: Route | None = field(default=None, compare=False)

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> Dial:
        route = wire.get("route")
        return cls(wire["src"], wire["dst"], int(wire["port"]), DialKind(wire["kind"]), wire["outcome"],
                   wire.get("detail"), MappingProxyType(dict(wire)),
                   Route.from_json(route) if isinstance(route, Mapping) else None)

    @property
    def went_nowhere(self) -> bool:
        """Nothing it sent got an answer: dropped without a word (no SYN-ACK before the timeout), or
        the kernel gave up on the next hop itself (EHOSTUNREACH: the neighbour on the link never
        answered, which a route out a link that leads nowhere comes to once its ARP entry has
        failed: the same dial, a few seconds later, that was "filtered")."""
        return self.outcome == "filtered" or \
            (self.outcome == "unreachable" and (self.detail or "").startswith("EHOSTUNREACH"))

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
    ip: str | None = None        # the address it listened at (`address` can be a name)

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> MasterListener:
        return cls(wire.get("address"), wire.get("port"), wire.get("error"), wire.get("ip"))


@dataclass(frozen=True)
class NetworkSeen:
    """What the probe saw. `dials` and `listeners` are where the ranks bind once their interface
    is pinned (as --launch and preflight's own jobs pin it); `unpinned` and `unpinned_dials` are a
    node's other family on that interface, where its ranks bind unpinned (an IPv6 hostname), when
    it has one: judged apart, never mixed into the pinned paths' evidence."""
    dials: tuple[Dial, ...]
    listeners: Mapping[str, Listener]
    master: MasterListener | None        # None: one node, no worker dials the master
    errors: Mapping[str, str]            # node -> why its part of the probe did not run
    nproc_per_node: int
    unpinned: Mapping[str, Listener] = field(default_factory=dict)
    unpinned_dials: tuple[Dial, ...] = ()
    backend: str | None = None           # the run's backend (None: a recording that did not say)
    ranks: Mapping[str, int] = field(default_factory=dict)   # node -> its own ranks (a hostfile's slots)

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> NetworkSeen:
        master = wire.get("master") or None
        dials = [Dial.from_json(p) for p in wire.get("pairs", ())]
        return cls(tuple(d for d in dials if not d.sent.get("unpinned")),
                   {name: Listener.from_json(one) for name, one in wire.get("listeners", {}).items()},
                   None if master is None else MasterListener.from_json(master),
                   dict(wire.get("errors", {})), int(wire.get("nproc_per_node", 2)),
                   {name: Listener.from_json(one) for name, one in wire.get("unpinned", {}).items()},
                   tuple(d for d in dials if d.sent.get("unpinned")), wire.get("backend"),
                   {name: int(n) for name, n in wire.get("ranks", {}).items()})

    def ranks_on(self, name: str) -> int:
        """The ranks torchrun starts on `name`: its own count where the probe recorded one (a
        hostfile gives each host its slots), else the one count for every node."""
        return self.ranks.get(name, self.nproc_per_node)

    def blocked(self, names: set[str]) -> list[Dial]:
        """The dials between these nodes that found the path blocked: a listener's port (as Gloo's
        would be) not opened, a free port dropped or rejected, the master port not reached."""
        return [d for d in self.dials if d.src in names and d.dst in names and
                (d.blocks or d.kind is DialKind.MASTER and d.outcome not in ("open", "open-unverified"))]

    def route(self, src: str, dst: str) -> Route | None:
        """`src`'s own route to `dst`'s address, as its dials there reported it (None: not said)."""
        return next((d.route for d in self.dials if d.src == src and d.dst == dst and d.route is not None
                     and d.kind is not DialKind.MASTER), None)

    def answered(self, pair: set[str]) -> bool:
        """Whether anything one of these two nodes sent the other got an answer (a connection opened,
        or a free port refused it): whatever drops there does not drop all of it."""
        return any(d.outcome in ("open", "open-unverified", "refused") for d in self.dials if {d.src, d.dst} == pair)

    def into(self, dst: str, own: bool, unpinned: bool = False) -> list[Dial]:
        """The dials into `dst`'s listener (its `unpinned` one): from the other nodes, or (own) from itself."""
        return [d for d in (self.unpinned_dials if unpinned else self.dials)
                if d.dst == dst and (d.src == dst) == own and d.kind is not DialKind.MASTER]

    def pinned_binds(self, names) -> dict[str, str | None]:
        """The address each node's ranks bind once preflight pins their interface: its listener's."""
        return {name: self.listeners[name].address if name in self.listeners else None for name in names}

    def blocking(self, binds: Mapping[str, str | None], ranks: Mapping[str, int]) -> list[Dial]:
        """The dials that found blocked a path a job's ranks will use when each node's ranks bind
        `binds[node]`: into that address (from another node; from the node itself when it runs
        more than one rank: `ranks[node]`), and the master port. A node whose address was not probed (None, or
        another than any listener's) is judged by nothing here."""
        names = set(binds)
        return [d for d in (*self.dials, *self.unpinned_dials) if d.src in names and d.dst in names and
                ((d.kind is DialKind.MASTER and d.outcome not in ("open", "open-unverified")) or
                 (d.kind is not DialKind.MASTER and d.blocks and binds[d.dst] is not None
                  and d.sent.get("address") == binds[d.dst] and (d.src != d.dst or ranks.get(d.dst, 1) > 1)
                  and self.used(d, binds)))]

    def used(self, d: Dial, binds: Mapping[str, str | None]) -> bool:
        """Whether the job's ranks open this connection. Gloo joins two nodes' ranks one way only:
        the higher address connects, the lower listens (gloo's Device::isInitiator compares the
        addresses, then the ports), so a dial into the higher address's listener is a path Gloo
        never takes. Another backend (NCCL's bootstrap ring), two address families, an address
        not known, a recording that does not say its backend, or a node's ranks among themselves:
        used."""
        if self.backend != "gloo" or d.src == d.dst:
            return True
        lower = gloo_listens(d.sent.get("address"), binds.get(d.src))
        return lower is not False


def gloo_listens(listener: str | None, connector: str | None) -> bool | None:
    """Whether Gloo's ranks at `listener` listen for those at `connector` (its address is the
    lower: bytes compared, one family); None where it cannot be said (two families, not known)."""
    try:
        a, b = ipaddress.ip_address(listener or ""), ipaddress.ip_address(connector or "")
    except ValueError:
        return None
    return a.packed < b.packed if a.version == b.version else None


def not_run_over(blocked: Dial) -> str:
    """Why a job was not started: the path its ranks would use that the network probe found blocked."""
    d = blocked
    where = f" on {d.sent['address']}" if d.sent.get("address") else ""
    whose = "its own" if d.src == d.dst else f"{d.dst}'s"
    what = "the master port" if d.kind is DialKind.MASTER else f"{whose} port {d.port}{where}"
    return (f"{d.src} -> {what} is blocked ({d.outcome}), so the job's ranks could not connect "
            f"(see {'master-reachable' if d.kind is DialKind.MASTER else 'ephemeral-ports'})")

