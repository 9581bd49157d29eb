"""The path-MTU probe: the largest packet that passes with don't-fragment set from every node to
every other node, between the addresses the ranks will use (node/pathmtu.py), beside each end's
interface MTU. A hop that drops what the hosts' MTU lets them send, and says nothing (a 1500-byte
switch port between jumbo-frame hosts), passes the handshake and small collectives and hangs the
first large one; this finds it in well under a second a pair, all pairs at once."""

from __future__ import annotations

import secrets
import time

from ddp_preflight.node import protocol
from ddp_preflight.rules.facts import Missing
from ddp_preflight.rules.routes import toward_master

from ..model import Context, NodeFacts, Options
from .job_end import load_words, slowdown, why_ended
from .network import Ready

READY_TIMEOUT = 20.0
PAIR_TIMEOUT = 5.0       # one direction's search, at most (it takes about 0.4 s when sizes are lost)


def endpoint(node: NodeFacts, options: Options) -> tuple[str | None, str | None]:
    """The address the ranks will use on the node and its interface: the interface preflight
    pins (GLOO_SOCKET_IFNAME, toward the master) and its first IPv4 address, else a global IPv6
    one; else what Gloo binds unpinned; else the address the master reached the node at."""
    iface = toward_master(Context((node,), options), node)
    if iface is not None and iface.name != "lo":
        ordered = sorted(iface.addresses, key=lambda a: (a.family, a.scope == "link"))
        if ordered:
            return ordered[0].address, iface.name
    network = node.parsed.network
    bind = network if isinstance(network, Missing) else network.gloo_bind
    if not isinstance(bind, Missing) and bind.address:
        return bind.address, bind.interface
    reached = node.parsed.reached_at
    return (None if isinstance(reached, Missing) else reached), None


def probe(cluster, nodes: tuple[NodeFacts, ...], options: Options) -> dict:
    usable = [i for i in cluster.usable() if nodes[i].error is None]
    if len(usable) < 2:
        return {"skipped": "needs at least two reachable nodes"}
    started = time.monotonic()
    slow = slowdown(nodes[i] for i in usable)     # the bounds below are an idle node's
    token = secrets.token_hex(16)
    names = {i: nodes[i].node for i in usable}
    out: dict = {"nodes": {}, "pairs": [], "errors": {}}
    ends = {}
    for i in usable:
        address, interface = endpoint(nodes[i], options)
        if address is None:
            out["errors"][names[i]] = "no address of the node is known (its network facts are missing)"
        else:
            ends[i] = (address, interface)
            out["nodes"][names[i]] = {"address": address, "interface": interface}

    # 1. An echo on every node, on the ranks' address (a port the kernel picks, as Gloo's).
    echoes, ready = {}, {}
    for i, (address, interface) in ends.items():
        ready[i] = Ready()
        echoes[i] = cluster.job(i, {"program": "pathmtu", "mode": "echo", "address": address, "interface": interface,
                                    "token": token, "duration": 40 * slow}, timeout=50 * slow, on_line=ready[i])
    try:
        for i in ends:
            if not ready[i].event.wait(READY_TIMEOUT * slow):
                out["errors"][names[i]] = (f"the echo did not start within {READY_TIMEOUT * slow:.0f} s"
                                           f"{load_words(nodes[i])}")
            elif "error" in ready[i].data:
                out["errors"][names[i]] = ready[i].data["error"]
            else:
                out["nodes"][names[i]].update(port=ready[i].data["port"], mtu=ready[i].data["mtu"])
        answering = [i for i in ends if names[i] not in out["errors"]]

        # 2. Every node measures its way to every other node's echo, all at once.
        probes = {}
        for i in answering:
            targets = [{"dst": names[j], "address": ends[j][0], "port": out["nodes"][names[j]]["port"]}
                       for j in answering if j != i]
            probes[i] = cluster.job(i, {"program": "pathmtu", "mode": "probe", "address": ends[i][0],
                                        "interface": ends[i][1], "token": token, "targets": targets,
                                        "timeout": PAIR_TIMEOUT}, timeout=(PAIR_TIMEOUT + 15) * slow)
        for i, job in probes.items():
            result = job.wait((PAIR_TIMEOUT + 30) * slow)
            lines = result.json_lines(protocol.RESULT)
            if not lines:
                out["errors"][names[i]] = (f"the probe gave no result: {why_ended(result, (PAIR_TIMEOUT + 15) * slow)}"
                                           f"{load_words(nodes[i])}")
                continue
            for pair in lines[-1]["pairs"]:
                dst = out["nodes"][pair["dst"]]
                out["pairs"].append({"src": names[i], "src_interface": ends[i][1], "src_mtu": lines[-1]["mtu"],
                                     "dst_interface": dst["interface"], "dst_mtu": dst.get("mtu"), **pair})
    finally:
        for job in echoes.values():
            job.stop()
        for job in echoes.values():
            job.wait(15)
    out["seconds"] = round(time.monotonic() - started, 3)
    return out
