"""master-reachable and ephemeral-ports: judged from what the network probe saw."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

from ..facts import Missing
from ..model import Context, NodeFacts, Status, Verdict
from .common import probe_data

MEANING = {
    "filtered": "silently dropped (a firewall)",
    "rejected": "rejected (a firewall's REJECT rule)",
    "refused": "refused although the probe listened there (a REJECT rule with a TCP reset)",
    "unreachable": "unreachable (no route, or another address family)",
    "error": "failed",
}


def check_master_reachable(ctx: Context) -> Iterator[Verdict]:
    data, early = probe_data(ctx, "network")
    if early:
        yield early
        return
    master = data["master"]
    if "error" in master:
        yield Verdict(Status.SKIP, ctx.master.node,
                      f"not probed: the probe could not listen on the master port ({master['error']}); see master-port")
        return
    port = master["port"]
    for pair in (p for p in data["pairs"] if p["kind"] == "master"):
        details = dict(pair)
        where = f"{master['address']}:{port}"
        if pair["outcome"] == "open":
            yield Verdict(Status.PASS, pair["src"], f"opens a connection to the master at {where}", None, details)
        else:
            yield Verdict(Status.FAIL, pair["src"],
                          f"cannot reach the master at {where}: {MEANING.get(pair['outcome'], pair['outcome'])}"
                          + (f" ({pair['detail']})" if pair.get("detail") else "")
                          + "; rendezvous will time out",
                          f"on {ctx.master.node}: sudo ufw allow proto tcp to any port {port}   # or: sudo nft add rule "
                          f"inet filter input tcp dport {port} accept", details)


def _lower(a: str, b: str) -> bool | None:
    """Whether address a sorts below b the way Gloo compares them (bytes, one family)."""
    try:
        x, y = ipaddress.ip_address(a), ipaddress.ip_address(b)
    except ValueError:
        return None
    return x.packed < y.packed if x.version == y.version else None


def _subnet(node: NodeFacts, address: str) -> str:
    network = node.parsed.network
    for iface in () if isinstance(network, Missing) else network.interfaces:
        for a in iface.addresses:
            if a.address == address and a.prefixlen is not None:
                return str(ipaddress.ip_network(f"{address}/{a.prefixlen}", strict=False))
    return f"{address}/32"


def check_ephemeral_ports(ctx: Context) -> Iterator[Verdict]:
    data, early = probe_data(ctx, "network")
    if early:
        yield early
        return
    by_name = {n.node: n for n in ctx.nodes}
    for name, reason in data["errors"].items():
        yield Verdict(Status.ERROR, name, f"{name}: the probe did not run: {reason}")
    for dst, listener in data["listeners"].items():
        if dst in data["errors"] or "ports" not in listener:
            continue
        into = [p for p in data["pairs"] if p["dst"] == dst and p["kind"] != "master"]
        blocked: dict = {}
        for pair in into:
            bad = (pair["kind"] == "listener" and pair["outcome"] != "open") or \
                  (pair["kind"] == "closed" and pair["outcome"] in ("filtered", "rejected"))
            if bad:
                blocked.setdefault(pair["src"], pair)
        low, high = listener["range"]
        details = {"address": listener["address"], "range": [low, high], "pairs": into,
                   "turned_away": listener.get("rejected", 0)}
        if not blocked:
            sources = sorted({p["src"] for p in into})
            yield Verdict(Status.PASS, dst, f"accepts new connections on its ephemeral ports ({low}-{high}) "
                          f"from {', '.join(sources)}", None, details)
            continue
        gloo_uses, broken = [], []
        for src, pair in blocked.items():
            src_address = data["listeners"].get(src, {}).get("address")
            order = _lower(listener["address"], src_address) if src_address else None
            if pair["outcome"] == "unreachable" or order is None:
                broken.append(src)       # no path, or two address families: Gloo fails either way
            elif order:
                gloo_uses.append(src)    # the lower address listens, the higher connects (gloo Device::isInitiator)
        what = "; ".join(f"from {src}: {MEANING.get(p['outcome'], p['outcome'])}" for src, p in sorted(blocked.items()))
        node = by_name.get(dst)
        subnet = _subnet(node, listener["address"]) if node else listener["address"]
        fix = (f"on {dst}: sudo ufw allow from {subnet} proto tcp to any port {low}:{high}   "
               f"# or nftables: sudo nft insert rule inet filter input ip{'6' if ':' in subnet else ''} saddr {subnet} "
               f"tcp dport {low}-{high} accept")
        if broken:
            yield Verdict(Status.FAIL, dst,
                          f"{dst}'s ephemeral ports at {listener['address']} cannot be reached {what}: Gloo cannot "
                          "connect these nodes in either direction (see address-family and interface-choice)",
                          f"on {dst}: export GLOO_SOCKET_IFNAME=<the interface that reaches the others>", details)
        elif gloo_uses:
            yield Verdict(Status.FAIL, dst,
                          f"new connections to {dst}'s ephemeral ports are blocked {what}. {dst} has the lower address, "
                          f"so it listens and {', '.join(sorted(gloo_uses))} {'connects' if len(gloo_uses) == 1 else 'connect'}: "
                          "Gloo's process-group creation "
                          "hangs, then fails with 'Connect timeout' (seed 002)", fix, details)
        else:
            yield Verdict(Status.WARN, dst,
                          f"new connections to {dst}'s ephemeral ports are blocked {what}. Gloo happens to connect "
                          f"the other way between these nodes (the lower address listens), but NCCL, more ranks or "
                          "new addresses can need this direction", fix, details)
