"""path-mtu: judged from what the path-MTU probe saw (preflight/probes/path_mtu.py). Each direction
of each pair on its own: the largest packet that passed with don't-fragment set, against the
packets TCP will send that way.

A TCP connection sends packets up to the smaller of the two ends' MTUs (each end announces its
own as the MSS). When a hop between them drops larger packets and sends no ICMP "fragmentation
needed" back, TCP never learns the path's size (Linux leaves tcp_mtu_probing off): the handshake
and small messages pass, and the first segment of full size is retransmitted until the
connection times out. That is a Gloo or NCCL job whose small collectives work and whose first
large all_reduce hangs (NVIDIA/nccl#1524, #2135, pytorch#130739)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ddp_preflight.rules.fix import Action, Fix
from ddp_preflight.rules.routes import dead_route, detour, drop_route

from ..model import Context, Status, Verdict
from ..probes.network_seen import NetworkSeen
from ..probes.path_mtu_seen import Direction, PathMtuSeen
from .common import probed
from .reverse_path import network_seen, route_toward, unanswered

PASSES = ("fits", "learned")     # full size passed, or a hop said so with ICMP (TCP adapts to that)


def _mtu(name: str, interface: str | None, mtu: int | None) -> str:
    return f"{name}'s {interface or 'interface'}{f' MTU {mtu}' if mtu else ' (MTU not read)'}"


def lost_words(d: Direction) -> str:
    """What the probe saw on one direction, with both ends' MTUs, in one clause."""
    if d.outcome == "blocked-here":
        return (f"{d.src} -> {d.dst}: {d.src}'s own firewall refuses "
                + (f"packets over {d.passed} bytes" if d.passed else "every packet") + f" it sends to {d.dst}")
    src_mtu = d.src_end_mtu
    ends = (f"{d.src_interface or 'interface'} MTU {src_mtu} on both ends"
            if src_mtu == d.dst_mtu and d.src_interface == d.dst_interface else
            f"{_mtu(d.src, d.src_interface, src_mtu)}, {_mtu(d.dst, d.dst_interface, d.dst_mtu)}")
    return f"{d.src} -> {d.dst}: packets over {d.passed} bytes are lost without an ICMP reply ({ends})"


def _dead_route(ctx: Context, src: str, dst: str) -> tuple[str, str, Fix] | None:
    """Either end's route to the other out a dead link (down, no carrier), as the facts (to the
    master) or the network probe's dials (to a peer) said it; else either end's route to the
    master through a second interface that takes over the LAN's: that end, the words, the fix."""
    seen = network_seen(ctx) or NetworkSeen((), {}, None, {}, 1)
    for end, other in ((src, dst), (dst, src)):
        node = next((n for n in ctx.nodes if n.node == end), None)
        route, peer = route_toward(ctx, seen, end, other) if node is not None else (None, other)
        dead = dead_route(node, route) if node is not None and route is not None else None
        if dead is not None:
            picked, why = dead
            return (end, f"{end}'s route to {picked.address} goes out {picked.interface}, which {why}: what it "
                    f"sends {peer} (its probes and its answers) goes nowhere", drop_route(end, picked, peer))
    for end in (src, dst):
        # A live second interface's route to the master takes over the LAN's, and nothing the node
        # sent the master there was answered (the network probe): its ranks bind that interface's
        # address (the pin follows the route), which the others have no route to.
        node = next((n for n in ctx.nodes if n.node == end), None)
        taken = detour(node) if node is not None and node is not ctx.master else None
        if taken is not None and unanswered(seen, end, ctx.master.node):
            picked, why, lan = taken
            return (end, f"{end}'s route to the master ({picked.address}) goes out {picked.interface}, which {why}: "
                    f"its ranks bind {picked.interface}'s address, and what it sends the master goes nowhere",
                    drop_route(end, picked, instead=lan))
    return None


def _fix_mtu(d: Direction, seen: PathMtuSeen) -> int:
    """What passes both ways between the two nodes."""
    back = seen.back(d)
    return min(d.passed or 0, back.passed or 0) if back else d.passed or 0


def _fix(d: Direction, size: int, nodes: list[str]) -> Fix | None:
    """The MTU lowered on each of these nodes whose interface the probe named (None: on none)."""
    interfaces = {d.src: d.src_interface, d.dst: d.dst_interface}
    mtus = {d.src: d.src_end_mtu, d.dst: d.dst_mtu}
    nodes = sorted(n for n in nodes if interfaces[n])      # one fix for both directions: printed once
    lower = tuple(f"on {n}: sudo ip link set dev {interfaces[n]} mtu {size}" for n in nodes)
    if not lower:
        return None
    largest = max((m for m in mtus.values() if m), default=size)
    return Fix(Action.RUN, lower, nodes[0] if len(nodes) == 1 else None,
               f"what passes between {' and '.join(sorted((d.src, d.dst)))}; or make every hop between them "
               f"(switch port, VLAN, tunnel) carry {largest}-byte packets")


def _fix_all(ds: list[Direction], size: int) -> Fix | None:
    """The MTU lowered to `size` on every node of these directions whose MTU is larger and whose
    interface the probe named; one pair's is _fix's, word for word."""
    if len(ds) == 1 or len({frozenset((d.src, d.dst)) for d in ds}) == 1:
        d = ds[0]
        mtus = {d.src: d.src_end_mtu, d.dst: d.dst_mtu}
        return _fix(d, size, [n for n in (d.src, d.dst) if (mtus[n] or size + 1) > size])
    interfaces: dict[str, str] = {}
    largest = size
    for d in ds:
        for node, iface, mtu in ((d.src, d.src_interface, d.src_end_mtu), (d.dst, d.dst_interface, d.dst_mtu)):
            if iface and (mtu or size + 1) > size:
                interfaces.setdefault(node, iface)
            largest = max(largest, mtu or 0)
    nodes = sorted(interfaces)
    if not nodes:
        return None
    return Fix(Action.RUN, tuple(f"on {n}: sudo ip link set dev {interfaces[n]} mtu {size}" for n in nodes),
               nodes[0] if len(nodes) == 1 else None,
               f"what passes between {', '.join(nodes[:-1])} and {nodes[-1]}; or make every hop between them "
               f"(switch port, VLAN, tunnel) carry {largest}-byte packets")


def _too_large_here(ds: list[Direction], seconds: Any) -> Verdict:
    """src's MTU alone is larger than what passes to these peers (theirs is smaller and holds TCP
    under it): Gloo works, anything larger src sends them is lost. One fix on src."""
    d, size = ds[0], ds[0].passed or 0
    src, peers = d.src, ", ".join(x.dst for x in ds)
    details: dict[str, Any] = {"pairs": [x.to_json() for x in ds], "probe_seconds": seconds, "fix_mtu": size}
    if len(ds) == 1:
        details.update(pair=d.to_json(), tcp_packet=d.tcp_packet)
        return Verdict(Status.WARN, src, f"{lost_words(d)}: TCP to {d.dst} stays at {d.tcp_packet} bytes ({d.dst}'s "
                       f"MTU), so Gloo works; anything larger {src} sends that way is lost", _fix(d, size, [src]), details)
    theirs = ", ".join(_mtu(x.dst, x.dst_interface, x.dst_mtu) for x in ds)
    largest = max((m for x in ds for m in (x.src_end_mtu, x.dst_mtu) if m), default=size)
    fix = None if not d.src_interface else Fix(
        Action.RUN, (f"on {src}: sudo ip link set dev {d.src_interface} mtu {size}",), src,
        f"what passes between {src} and {peers}; or make every hop between them (switch port, VLAN, tunnel) carry "
        f"{largest}-byte packets")
    return Verdict(Status.WARN, src,
                   f"{src} -> {peers}: packets over {size} bytes are lost without an ICMP reply "
                   f"({_mtu(src, d.src_interface, d.src_end_mtu)}; {theirs}): TCP to each stays at its MTU, so Gloo "
                   f"works; anything larger {src} sends them is lost", fix, details)


def _blocked_here(d: Direction, details: dict[str, Any]) -> Verdict:
    """src's kernel refused to send a size with EPERM: a netfilter rule on src's own output
    dropped it (the kernel tells the sender so; a drop on the way, or at dst, is silent). The
    finding is on src, whatever dst's MTU."""
    src, dst = d.src, d.dst
    sizes = (f"packets of {d.blocked} bytes and more it sends to {dst} ({d.address}), while "
             f"{d.passed}-byte ones pass" if d.passed else f"the packets it sends to {dst} ({d.address})")
    return Verdict(Status.FAIL, src,
                   f"{src} -> {dst}: {src}'s own firewall refuses {sizes}: the kernel answered the send with "
                   f"EPERM, which a netfilter output rule on {src} gives (nothing on the way or at {dst} does); "
                   f"Gloo's {'large messages' if d.passed else 'connections'} from {src} to {dst} will not get through",
                   Fix(Action.CHANGE, (f"on {src}: remove or narrow the output rule that drops them: "
                                       "`sudo nft -a list ruleset` shows the output hook's rules with their handles "
                                       "(`sudo iptables -S OUTPUT` where iptables is used)",), src),
                   {**details, "blocked": d.blocked})


def check_path_mtu(ctx: Context) -> Iterator[Verdict]:
    seen, early = probed(ctx, "path-mtu", PathMtuSeen.from_json)
    if seen is None:
        yield from [early] if early else []
        return
    for name, reason in seen.errors.items():
        yield Verdict(Status.ERROR, name, f"{name}: the path-MTU probe did not run: {reason}")
    fine: dict[str, list[Direction]] = {}
    dead_ends: dict[tuple[str, str, Fix], list[Direction]] = {}
    one_end: dict[tuple[str, str | None, int], list[Direction]] = {}
    hanging: list[tuple[Direction, int, dict[str, Any]]] = []
    for d in seen.directions:
        src, dst = d.src, d.dst
        details: dict[str, Any] = {"pair": d.to_json(), "probe_seconds": seen.seconds}
        if d.outcome in PASSES:
            fine.setdefault(src, []).append(d)
        elif d.outcome == "blocked-here":
            yield _blocked_here(d, details)
        elif d.outcome in ("error", "unanswered") and (dead := _dead_route(ctx, src, dst)) is not None:
            # Not the probe's failure, nor a firewall: one end's route to the other goes out a link that
            # carries nothing. One result on that end for all it stops (the other checks name it too,
            # with the same fix: printed once).
            dead_ends.setdefault(dead, []).append(d)
        elif d.outcome == "error":
            yield Verdict(Status.ERROR, src, f"{src} -> {dst}: the path-MTU probe failed: {d.detail}",
                          None, details)
        elif d.outcome == "unanswered":
            why = ("answered 'port unreachable'" if d.port_refused else
                   "no answer, even to small packets (UDP to that port dropped on the way, or at it)")
            yield Verdict(Status.SKIP, src, f"{src} -> {dst}: not measured: {dst}'s UDP probe at "
                          f"{d.address}:{d.port} gave {why}", None, details)
        elif d.hangs:
            size = _fix_mtu(d, seen)
            details.update(tcp_packet=d.tcp_packet, fix_mtu=size)
            hanging.append((d, size, details))
        else:
            # Only this end's MTU is too large: the other end's smaller MTU holds TCP under the limit.
            # One cause on src for every peer it is too large for: one result, one fix.
            one_end.setdefault((src, d.src_interface, d.passed or 0), []).append(d)
    for ds in one_end.values():
        yield _too_large_here(ds, seen.seconds)
    # One hop too small for the MTU several nodes share is one cause: each direction's result
    # carries the one fix that lowers every such node's MTU to what passes (printed once).
    fixes = {size: _fix_all([d for d, at, _ in hanging if at == size], size) for _, size, _ in hanging}
    for d, size, details in hanging:
        yield Verdict(Status.FAIL, d.src,
                      f"{lost_words(d)}: TCP sends {d.tcp_packet}-byte packets that way, so connections open "
                      "and small collectives work but the first large one hangs", fixes[size], details)
    for (end, why, fix), stopped in dead_ends.items():
        paths = ", ".join(f"{d.src} -> {d.dst}" for d in stopped)
        yield Verdict(Status.FAIL, end, f"{paths}: not measured: {why}", fix,
                      {"pairs": [d.to_json() for d in stopped], "probe_seconds": seen.seconds})
    for src, ok in fine.items():
        full: dict[int | None, list[str]] = {}
        for d in ok:
            if d.outcome == "fits":
                full.setdefault(d.passed, []).append(d.dst)
        parts = [f"{', '.join(dsts)} at full size ({size} bytes)" for size, dsts in full.items()]
        parts += [f"{d.dst} up to {d.passed} bytes, as a hop said with ICMP 'fragmentation needed' "
                  "(TCP adapts to it)" for d in ok if d.outcome != "fits"]
        yield Verdict(Status.PASS, src, f"don't-fragment packets from {src}'s "
                      f"{ok[0].src_interface or 'interface'} reach {', '.join(parts)}", None,
                      {"pairs": [d.to_json() for d in ok], "probe_seconds": seen.seconds})
