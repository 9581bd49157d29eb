"""What the bandwidth and compute probes measured, as typed data: the all_reduce job's figures
(or how it failed) and each node's matmul rate (per GPU on a CUDA run). The probes' JSON stays
the wire and the recording; bandwidth and compute-balance judge these fields, and a figure a
check puts in its details keeps the JSON as it came (`sent`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class JobFailure:
    """The probe's torchrun job on one node, failed: its own error, and whether its bound ended it."""
    node: str
    error: str
    timed_out: bool = False
    sent: Mapping[str, Any] = field(default_factory=dict, compare=False)
    unfinished: bool = False              # a stop (ours, or its supervisor's) or a signal from outside ended it
    load_per_cpu: float | None = None     # its node's load per CPU, as its facts read it

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> JobFailure:
        load = wire.get("load_per_cpu")
        return cls(wire["node"], wire["error"], bool(wire.get("timed_out", False)), MappingProxyType(dict(wire)),
                   bool(wire.get("unfinished", False)), float(load) if isinstance(load, (int, float)) else None)

    def to_json(self) -> dict:
        return dict(self.sent)


KERNEL_TICK_US = 10_000     # TCP_INFO's busy time is counted in jiffies: 10 ms at HZ=100, the coarsest


@dataclass(frozen=True)
class LinkSent:
    """What one node's ranks sent to another's while the large messages flowed, as the kernel
    counted it on the sender's sockets (TCP_INFO): bytes, bytes sent again, the round trip, data
    segments, and segments lost (sent again, less the peer's D-SACK duplicates: spurious)."""
    src: str
    dst: str
    sent: int
    retrans: int
    rtt_us: int
    segs: int = 0
    lost: int = 0
    busy_us: int = 0       # the time it had data to send (TCP_INFO's busy time; 0: not counted)
    undelivered: int = 0   # segments sent that the peer never acknowledged, less spurious resends: lost
                           # also where no resend was counted (the sender's own firewall dropped them)

    @property
    def rate(self) -> float | None:
        """Bytes per second while it had data to send: this link's own throughput; None: not counted."""
        return self.sent / (self.busy_us / 1e6) if self.busy_us > 0 else None

    @property
    def least_rate(self) -> float | None:
        """Bytes per second it carried at least: its rate, or, for a link whose busy time reads 0
        although it sent (the kernel counts that time in whole ticks, and a fast link sends a few
        MB within one: seen on the lab's 10 Gbit/s veths, 3 MB and 0 us), its bytes over one
        tick of the coarsest kernel clock. None: it sent nothing."""
        if self.busy_us > 0:
            return self.rate
        return self.sent / (KERNEL_TICK_US / 1e6) if self.sent > 0 else None

    @property
    def loss(self) -> float:
        """The share of the data segments sent that were lost on the way."""
        return max(self.lost, self.undelivered) / self.segs if self.segs else 0.0


def _links(wire: Mapping[str, Any], nodes: tuple[str, ...], world: int) -> tuple[LinkSent, ...]:
    """The job's per-rank connections, summed per (sending node, receiving node); a peer address
    is a node's when one of that node's ranks used it as its own end. Ranks on one node: skipped."""
    per_node = max(1, world // max(1, len(nodes)))

    def node_of(rank: int) -> str | None:
        return nodes[rank // per_node] if 0 <= rank // per_node < len(nodes) else None
    raw = [x for x in wire.get("links") or () if isinstance(x, dict) and isinstance(x.get("rank"), int)]
    owner = {x["local"]: node_of(x["rank"]) for x in raw if x.get("local")}
    summed: dict[tuple[str, str], list[int]] = {}
    for x in raw:
        src, dst = node_of(x["rank"]), owner.get(x.get("peer"))
        if src is None or dst is None or src == dst:
            continue
        total = summed.setdefault((src, dst), [0, 0, 0, 0, 0, 0, 0])
        total[0] += int(x.get("sent") or 0)
        total[1] += int(x.get("retrans") or 0)
        total[2] = max(total[2], int(x.get("rtt_us") or 0))
        total[3] += int(x.get("segs") or 0)
        total[4] += int(x.get("lost") or 0)
        total[5] = max(total[5], int(x.get("busy_us") or 0))
        total[6] += int(x.get("undelivered") or 0)
    return tuple(LinkSent(src, dst, *figures) for (src, dst), figures in sorted(summed.items()))


@dataclass(frozen=True)
class BandwidthSeen:
    """The all_reduce job between the nodes (one rank per node; per GPU on one GPU node)."""
    nodes: tuple[str, ...]
    world_size: int
    busbw: float                        # bytes/s: bus bandwidth at the largest message
    algbw: float                        # bytes/s: algorithm bandwidth there
    latency_us: Mapping[str, float]     # message bytes (as text) -> microseconds
    message_bytes: int
    seconds: float
    failed: JobFailure | None = None
    links: tuple[LinkSent, ...] = ()    # per pair of nodes (not counted by an older job: none)

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> BandwidthSeen:
        if "failed" in wire:
            return cls((), 0, 0.0, 0.0, {}, 0, 0.0, JobFailure.from_json(wire["failed"]))
        # As sent (no float() of a whole number): the bandwidth check's details repeat them.
        nodes = tuple(wire["nodes"])
        return cls(nodes, wire["world_size"], wire["busbw_bytes_per_s"], wire["algbw_bytes_per_s"],
                   dict(wire["latency_us"]), wire["bytes"], wire["seconds"],
                   links=_links(wire, nodes, wire["world_size"]))


@dataclass(frozen=True)
class GpuFigures:
    index: int
    gflops: float
    name: str | None = None
    dtype: str | None = None


@dataclass(frozen=True)
class NodeFigures:
    """One node's matmul rate: its CPU's (with the threads it used and why), or its GPUs'
    (`gflops` then is its slowest GPU's)."""
    gflops: float
    threads: int | None = None
    threads_from: str | None = None
    cpus: int | None = None
    gpus: tuple[GpuFigures, ...] = ()
    slowest_gpu: int | None = None
    sent: Mapping[str, Any] = field(default_factory=dict, compare=False)
    thread_gflops: float | None = None  # one thread's rate, timed on its own CPU clock
    cpus_usable: float | None = None    # its affinity and its cgroup's quota

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> NodeFigures:
        gpus = tuple(GpuFigures(g["index"], g["gflops"], g.get("name"), g.get("dtype")) for g in wire.get("gpus", ()))
        return cls(wire["gflops"], wire.get("threads"), wire.get("threads_from"), wire.get("cpus"), gpus,
                   wire.get("slowest_gpu"), MappingProxyType(dict(wire)), wire.get("thread_gflops"),
                   wire.get("cpus_usable"))

    @property
    def working_threads(self) -> float | None:
        """The threads that compute at once: those set, within the CPUs it may use."""
        if not self.threads:
            return None
        return min(float(self.threads), self.cpus_usable) if self.cpus_usable else float(self.threads)

    @property
    def rate(self) -> float:
        """What its CPU computes with its threads when nothing else takes the cores, GFLOP/s: the
        best timed product, or one thread's rate (CPU-clocked: others' load does not lower it)
        times the threads that compute at once, whichever is higher. Nodes sharing one machine's
        cores (VMs, containers, the lab) slow each other's timed products, never their CPU-clocked
        one: a node is not a straggler because its neighbour was busy while it was measured. A node
        with fewer threads, fewer usable CPUs (its quota) or a slower core is. For GPUs: `gflops`."""
        if self.gpus or not self.thread_gflops or not self.working_threads:
            return self.gflops
        return max(self.gflops, round(self.thread_gflops * self.working_threads, 2))

    @property
    def shared(self) -> bool:
        """Its timed products ran well below what its threads compute alone: something else on
        its machine took the cores while it was measured."""
        return self.rate > self.gflops / 0.7

    @property
    def fastest(self) -> float:
        """Its best rate in GFLOP/s: its fastest GPU's, or its CPU's (`rate`)."""
        return max((g.gflops for g in self.gpus), default=self.rate)

    def gpu(self, index: int | None) -> GpuFigures:
        return next(g for g in self.gpus if g.index == index)

    def to_json(self) -> dict:
        return dict(self.sent)


@dataclass(frozen=True)
class ComputeSeen:
    nodes: Mapping[str, NodeFigures]
    errors: Mapping[str, str]           # node -> why its benchmark did not run

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> ComputeSeen:
        return cls({name: NodeFigures.from_json(f) for name, f in wire.get("nodes", {}).items()},
                   dict(wire.get("errors", {})))
