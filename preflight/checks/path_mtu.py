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

from ..model import Context, Status, Verdict
from .common import probe_data

PASSES = ("fits", "learned")     # full size passed, or a hop said so with ICMP (TCP adapts to that)


def tcp_packet(pair: dict) -> int:
    """The largest packet TCP sends from src to dst: the smaller of the two ends' MTUs."""
    return min(m for m in (pair["route_mtu"], pair.get("dst_mtu")) if m)


def hangs(pair: dict) -> bool:
    """Whether TCP's own packets from src to dst are larger than what passes: a black hole."""
    return pair.get("outcome") == "blackhole" and tcp_packet(pair) > pair["passed"]


def blackholes(data: dict) -> list[dict]:
    """The directions where large TCP segments vanish (for the probes that move large messages)."""
    return [p for p in data.get("pairs", ()) if hangs(p)]


def _mtu(name: str, interface: str | None, mtu: int | None) -> str:
    return f"{name}'s {interface or 'interface'}{f' MTU {mtu}' if mtu else ' (MTU not read)'}"


def lost_words(pair: dict) -> str:
    """What the probe saw on one direction, with both ends' MTUs, in one clause."""
    src_mtu = pair.get("src_mtu") or pair["route_mtu"]
    ends = (f"{pair['src_interface'] or 'interface'} MTU {src_mtu} on both ends"
            if src_mtu == pair.get("dst_mtu") and pair.get("src_interface") == pair.get("dst_interface") else
            f"{_mtu(pair['src'], pair.get('src_interface'), src_mtu)}, "
            f"{_mtu(pair['dst'], pair.get('dst_interface'), pair.get('dst_mtu'))}")
    return (f"{pair['src']} -> {pair['dst']}: packets over {pair['passed']} bytes are lost without an ICMP "
            f"reply ({ends})")


def _fix_mtu(pair: dict, pairs: list[dict]) -> int:
    """What passes both ways between the two nodes."""
    back = next((p for p in pairs if p["src"] == pair["dst"] and p["dst"] == pair["src"]
                 and p.get("passed") and p.get("outcome") == "blackhole"), None)
    return min(pair["passed"], back["passed"]) if back else pair["passed"]


def _fix(pair: dict, size: int, nodes: list[str]) -> str:
    interfaces = {pair["src"]: pair.get("src_interface"), pair["dst"]: pair.get("dst_interface")}
    mtus = {pair["src"]: pair.get("src_mtu") or pair["route_mtu"], pair["dst"]: pair.get("dst_mtu")}
    lower = "; ".join(f"on {n}: sudo ip link set dev {interfaces[n] or '<its interface>'} mtu {size}" for n in nodes)
    largest = max(m for m in mtus.values() if m)
    return (f"{lower}   # what passes between {pair['src']} and {pair['dst']}; or make every hop between them "
            f"(switch port, VLAN, tunnel) carry {largest}-byte packets")


def check_path_mtu(ctx: Context) -> Iterator[Verdict]:
    data, early = probe_data(ctx, "path-mtu")
    if early:
        yield early
        return
    for name, reason in data["errors"].items():
        yield Verdict(Status.ERROR, name, f"{name}: the path-MTU probe did not run: {reason}")
    pairs = data["pairs"]
    fine: dict[str, list[dict]] = {}
    for pair in pairs:
        src, dst = pair["src"], pair["dst"]
        details: dict[str, Any] = {"pair": dict(pair), "probe_seconds": data.get("seconds")}
        outcome = pair["outcome"]
        if outcome in PASSES:
            fine.setdefault(src, []).append(pair)
        elif outcome == "error":
            yield Verdict(Status.ERROR, src, f"{src} -> {dst}: the path-MTU probe failed: {pair.get('detail')}",
                          None, details)
        elif outcome == "unanswered":
            why = ("answered 'port unreachable'" if pair.get("port_refused") else
                   "no answer, even to small packets (UDP to that port dropped on the way, or at it)")
            yield Verdict(Status.SKIP, src, f"{src} -> {dst}: not measured: {dst}'s UDP probe at "
                          f"{pair['address']}:{pair['port']} gave {why}", None, details)
        elif hangs(pair):
            size = _fix_mtu(pair, pairs)
            packet = tcp_packet(pair)
            details.update(tcp_packet=packet, fix_mtu=size)
            mtus = {pair["src"]: pair.get("src_mtu") or pair["route_mtu"], pair["dst"]: pair.get("dst_mtu")}
            yield Verdict(Status.FAIL, src,
                          f"{lost_words(pair)}: TCP sends {packet}-byte packets that way, so connections open "
                          "and small collectives work but the first large one hangs",
                          _fix(pair, size, [n for n in (src, dst) if (mtus[n] or size + 1) > size]), details)
        else:
            # Only this end's MTU is too large: the other end's smaller MTU holds TCP under the limit.
            size = pair["passed"]
            packet = tcp_packet(pair)
            details.update(tcp_packet=packet, fix_mtu=size)
            yield Verdict(Status.WARN, src,
                          f"{lost_words(pair)}: TCP to {dst} stays at {packet} bytes ({dst}'s MTU), so Gloo works; "
                          f"anything larger {src} sends that way is lost",
                          _fix(pair, size, [src]), details)
    for src, ok in fine.items():
        full: dict[int, list[str]] = {}
        for p in ok:
            if p["outcome"] == "fits":
                full.setdefault(p["passed"], []).append(p["dst"])
        parts = [f"{', '.join(dsts)} at full size ({size} bytes)" for size, dsts in full.items()]
        parts += [f"{p['dst']} up to {p['passed']} bytes, as a hop said with ICMP 'fragmentation needed' "
                  "(TCP adapts to it)" for p in ok if p["outcome"] != "fits"]
        yield Verdict(Status.PASS, src, f"don't-fragment packets from {src}'s "
                      f"{ok[0].get('src_interface') or 'interface'} reach {', '.join(parts)}", None,
                      {"pairs": [dict(p) for p in ok], "probe_seconds": data.get("seconds")})
