"""bandwidth's links: each measured link between the nodes, on its own (the kernel's TCP_INFO per
connection, from the probe's all_reduce): which node's own links are the slow ones, and which path
loses packets; and each node's interface toward the master (its kind and nominal speed)."""

from __future__ import annotations

from collections.abc import Iterator

from ddp_preflight.rules.facts import Interface, Missing
from ddp_preflight.rules.facts.network import RandomDrop
from ddp_preflight.rules.fix import Fix, change, run
from ddp_preflight.rules.routes import toward_master

from ..model import Context, NodeFacts, Status, Verdict
from ..probes.bandwidth_seen import BandwidthSeen, LinkSent
from .units import rate, size

STRAGGLER_RATIO = 0.7       # a node below this fraction of the fastest one's rate holds every step back
SLOW_KINDS = {"wireless": "Wi-Fi", "vpn": "a VPN tunnel"}
# Lost segments (sent again, less the spurious ones the peer reported as duplicates) over data
# segments sent at which a path is lossy. A busy host loses a few itself (its own backlog: 3 of
# 10986 between two loopback ranks on this 2-core box, 0.03%); 0.5% is a link's loss, and caps
# one TCP stream far below its rate (Mathis: rate ~ MSS / (RTT x sqrt(loss))). Under
# LOSS_MIN_SEGMENTS the share says little.
LOSS_WARN = 0.005
LOSS_MIN_SEGMENTS = 1000


def links(ctx: Context, names: list[str]) -> dict[str, dict]:
    """Each measured node's interface toward the master, with its kind and speed where known."""
    by_name = {n.node: n for n in ctx.nodes}
    out = {}
    for name in names:
        node: NodeFacts | None = by_name.get(name)
        iface = toward_master(ctx, node) if node is not None else None
        if iface is not None:
            out[name] = {"interface": iface.name, "kind": iface.kind, "speed_mbit": iface.speed_mbit}
    return out


def slowest_link(found: dict[str, dict]) -> tuple[str, dict] | None:
    """Wi-Fi or a VPN first (their nominal speed says little), else a link slower than another;
    None when nothing sets one link apart."""
    for name, link in found.items():
        if link["kind"] in SLOW_KINDS:
            return name, link
    known = {name: link for name, link in found.items() if link.get("speed_mbit")}
    if len({link["speed_mbit"] for link in known.values()}) > 1:
        name = min(known, key=lambda n: known[n]["speed_mbit"])
        return name, known[name]
    return None


def describe(name: str, link: dict) -> str:
    speed = f", {link['speed_mbit']} Mbit/s nominal" if link.get("speed_mbit") else ""
    kind = SLOW_KINDS.get(link["kind"], link["kind"])
    return f"{name}'s {link['interface']} ({kind}{speed})"


def links_carrying(seen: BandwidthSeen) -> list[LinkSent]:
    """The links that carried the all_reduce's data, at least one of its large messages: the
    others sent the algorithm's few control bytes, whose time says nothing of the link (2448 bytes
    over 144 ms, waiting on a slow peer, on the lab's ring)."""
    return [link for link in seen.links if link.least_rate and link.sent >= seen.message_bytes]


def slow_node_of(ctx: Context, seen: BandwidthSeen) -> Verdict | None:
    """The node whose own links are slow: every link to or from it carried less, while it had data
    to send (TCP_INFO: bytes sent over busy time, each link on its own), than STRAGGLER_RATIO of the
    slowest link between the other nodes. Needs a link that does not touch it (three nodes or
    more); with or without --params: every step's all_reduce waits for that node's links."""
    # A link whose busy time read 0 counts at the least it carried: the rule fires only where the
    # node's own links are slow against what the others carried at least, never on a tick's rounding.
    carrying = {(link.src, link.dst): link for link in links_carrying(seen)}
    rates = {pair: r for pair, link in carrying.items() if (r := link.least_rate)}

    def said(a: str, b: str, r: float) -> str:
        return f"{a} -> {b} {'at least ' if not carrying[a, b].busy_us else ''}{rate(r)}"
    for name in seen.nodes:
        own = {pair: r for pair, r in rates.items() if name in pair}
        others = {pair: r for pair, r in rates.items() if name not in pair}
        if not own or not others or max(own.values()) >= STRAGGLER_RATIO * min(others.values()):
            continue
        words = ", ".join(said(a, b, r) for (a, b), r in sorted(own.items()))
        fast = ", ".join(said(a, b, r) for (a, b), r in sorted(others.items()))
        link = links(ctx, [name]).get(name)
        capped = shaped(ctx, name, min(others.values()))
        fix = unshape(name, capped) if capped else by_wire(ctx, name) if link and link["kind"] == "wireless" else None
        where = f" ({describe(name, link)})" if link else ""
        cap = (f"; {name}'s {capped.name} sends through a {capped.shaper} queue capped at "
               f"{rate(capped.shaper_rate or 0)} (tc qdisc), below what the others carried") if capped else ""
        return Verdict(Status.WARN, name,
                       f"{name}'s links are the slow ones{where}: {words}, against {fast} between the other nodes "
                       f"(each link's bytes over the time it had data to send, the kernel's TCP_INFO){cap}; every "
                       f"step's all_reduce waits for {name}",
                       fix, {"link_rates_bytes_per_s": {f"{a}->{b}": round(r) for (a, b), r in sorted(rates.items())},
                             "slow_node": name, **({"shaper": {"interface": capped.name, "kind": capped.shaper,
                                                              "rate_bytes_per_s": capped.shaper_rate}}
                                                   if capped else {})})
    return None


def capped_link(ctx: Context, seen: BandwidthSeen) -> Verdict | None:
    """A link held at its sender's own queue cap (tbf, cake) where that cap is below its
    interface's nominal speed: it carried about the cap (within STRAGGLER_RATIO either way: tc
    counts the headers TCP_INFO's bytes leave out), so the cap, not the wire or a busy CPU, set
    its rate. Needs no third node to compare with (slow_node_of does), only the node's facts."""
    by_name = {n.node: n for n in ctx.nodes}
    for link in links_carrying(seen):
        node = by_name.get(link.src)
        iface = toward_master(ctx, node) if node is not None else None
        carried = link.least_rate
        if iface is None or not iface.shaper_rate or not iface.speed_mbit or carried is None or \
                iface.shaper_rate * 8 >= STRAGGLER_RATIO * iface.speed_mbit * 1e6 or \
                not STRAGGLER_RATIO * iface.shaper_rate <= carried <= iface.shaper_rate / STRAGGLER_RATIO:
            continue
        return Verdict(Status.WARN, link.src,
                       f"{link.src}'s {iface.name} sends through a {iface.shaper} queue capped at "
                       f"{rate(iface.shaper_rate)} (tc qdisc), below its link's {iface.speed_mbit} Mbit/s nominal: "
                       f"{link.src} -> {link.dst} carried {rate(carried)}, about the cap (the kernel's "
                       f"TCP_INFO); every step's all_reduce waits for that link",
                       unshape(link.src, iface), {"shaper": {"interface": iface.name, "kind": iface.shaper,
                                                             "rate_bytes_per_s": iface.shaper_rate},
                                                  "link": {"src": link.src, "dst": link.dst,
                                                           "bytes_per_s": round(carried)}})
    return None


def shaped(ctx: Context, name: str, others: float) -> Interface | None:
    """The node's interface toward the master, where its root queue caps what it sends (tbf, cake)
    below what the links between the other nodes carried (`others`, bytes/s): that cap alone keeps
    the node's links below theirs, whatever the wire."""
    node = next((n for n in ctx.nodes if n.node == name), None)
    iface = toward_master(ctx, node) if node is not None else None
    if iface is None or not iface.shaper or not iface.shaper_rate or iface.shaper_rate >= STRAGGLER_RATIO * others:
        return None
    return iface


def unshape(name: str, iface: Interface) -> Fix:
    return run(f"on {name}: sudo tc qdisc del dev {iface.name} root", name,
               f"its {iface.shaper} queue caps what {iface.name} sends at {rate(iface.shaper_rate or 0)}; the "
               "kernel's default queue then serves")


def lossy_paths(ctx: Context, seen: BandwidthSeen) -> Iterator[Verdict]:
    """A path that lost packets while the large messages flowed: its sender sent bytes again
    (TCP_INFO's retransmitted bytes over bytes sent). Named at the receiving node: the loss is
    on the way to it (its link, its NIC, a switch port, Wi-Fi). Throughput over TCP falls with the
    square root of the loss, and every step's all_reduce crosses that path."""
    lossy = [link for link in seen.links if link.segs >= LOSS_MIN_SEGMENTS and link.loss >= LOSS_WARN]
    if not lossy:
        return
    worst = max(lossy, key=lambda link: link.loss)
    others = [link for link in lossy if link is not worst]
    also = ("; also " + ", ".join(f"{link.src} -> {link.dst} {100 * link.loss:.2f}%" for link in others)) if others else ""
    lost_links = {"links": [{"src": link.src, "dst": link.dst, "sent": link.sent, "retrans": link.retrans,
                             "rtt_us": link.rtt_us, "segs": link.segs, "lost": link.lost,
                             "undelivered": link.undelivered} for link in seen.links], "loss_threshold": LOSS_WARN}
    if worst.undelivered > 2 * worst.lost:
        # Never acknowledged, and never counted as resent: TCP resends what the wire lost and counts
        # it; what the sender's own output rules (or qdisc) dropped it sends again as if new.
        yield Verdict(Status.WARN, worst.src,
                      f"{worst.src} drops what it sends to {worst.dst}: {worst.undelivered} of the {worst.segs} "
                      f"segments its ranks sent ({100 * worst.loss:.2f}%) were never acknowledged, and its kernel "
                      "counted no resend for them (TCP_INFO: sent less delivered, against retransmitted): they were "
                      f"dropped on {worst.src} before they left{also}{_by_rule(ctx, worst.src, OUTGOING)}; every "
                      "step's all_reduce crosses that path",
                      _drop_rule_fix(ctx, worst.src, OUTGOING) or
                      change(f"find what drops them on {worst.src}: ssh {worst.src} sudo nft list ruleset (its output "
                             f"rules), and ssh {worst.src} tc -s qdisc (drops)"), lost_links)
        return
    iface = links(ctx, [worst.dst]).get(worst.dst, {}).get("interface")
    show = f"ip -s link show {iface}" if iface else "ip -s link"
    yield Verdict(Status.WARN, worst.dst,
                  f"packets are lost on the way from {worst.src} to {worst.dst}: {worst.lost} of the {worst.segs} "
                  f"segments {worst.src}'s ranks sent ({100 * worst.loss:.2f}%, {size(worst.sent)}) had to be sent "
                  "again and were not duplicates (the kernel's TCP_INFO: retransmitted, less D-SACK), round trip "
                  f"{worst.rtt_us / 1000:.2f} ms{also}{_by_rule(ctx, worst.dst, INCOMING)}; over TCP a lossy path "
                  "carries far less than its rate, and every step's all_reduce crosses it",
                  _drop_rule_fix(ctx, worst.dst, INCOMING) or
                  change(f"find where {worst.dst} drops them: ssh {worst.dst} {show} (RX errors and "
                         "drops), then its cable, switch port or Wi-Fi; wire it if it is Wi-Fi"), lost_links)


OUTGOING = ("output", "postrouting")       # the hooks what a node sends passes
INCOMING = ("input", "prerouting")         # and what it receives


def _random_drop(ctx: Context, name: str, hooks: tuple[str, ...]) -> RandomDrop | None:
    """The node's own rule that drops a random share of what passes one of these hooks, as its
    ruleset (read as root) lists it: the loss is of its own making."""
    node = next((n for n in ctx.nodes if n.node == name), None)
    network = node.parsed.network if node is not None else None
    if network is None or isinstance(network, Missing) or isinstance(network.firewall, Missing):
        return None
    return next((d for d in network.firewall.random_drops if d.hook in hooks), None)


def _by_rule(ctx: Context, name: str, hooks: tuple[str, ...]) -> str:
    found = _random_drop(ctx, name, hooks)
    return f"; {name}'s own nftables rule drops a random share of them ({found.chain}: `{found.rule}`)" if found else ""


def _drop_rule_fix(ctx: Context, name: str, hooks: tuple[str, ...]) -> Fix | None:
    """Delete that rule: by its handle, looked up from its own text (the ruleset was read without
    handles), so the command is whole."""
    found = _random_drop(ctx, name, hooks)
    if found is None or "'" in found.rule:
        return None
    return run(f"on {name}: sudo nft delete rule {found.chain} handle $(sudo nft -a list chain {found.chain} | "
               f"grep -F '{found.rule} #' | sed 's/.*# handle //')", name,
               f"the rule in {found.chain} that drops a random share of what {name} "
               f"{'sends' if hooks is OUTGOING else 'receives'}")


def by_wire(ctx: Context, name: str) -> Fix:
    """Wire the node; the wired interface has no name before it is there, so interface-choice
    names its pin on the next run (no placeholder for the user to fill in)."""
    return change(f"connect {name} by wire; run preflight again: interface-choice then names the interface its "
                  "ranks reach the master on, and the GLOO_SOCKET_IFNAME that pins it", name,
                  "or all-reduce less often: accumulate gradients over several micro-batches inside model.no_sync()")
