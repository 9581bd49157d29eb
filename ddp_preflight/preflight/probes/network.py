"""The network probe: can every node open new TCP connections to every other node's
ephemeral ports (where Gloo listens), to its own (with more than one rank per node, its ranks
connect to each other there), and to the master's port (the rendezvous)?

Listeners bind only the address under test (what the ranks will bind: the address on the
interface preflight chose, which launch pins), live only for the probe, and answer only
connections that present this run's random token."""

from __future__ import annotations

import json
import secrets
import threading

from ddp_preflight.node import protocol
from ddp_preflight.rules.facts import Interface, Missing
from ddp_preflight.rules.routes import route_to_master, toward_master

from ..model import Context, NodeFacts, Options
from .job_end import why_ended

CONNECT_TIMEOUT = 2.5      # a dropped SYN is retried after 1 s, then 3 s: 2.5 s tells drop from slow
READY_TIMEOUT = 20.0


DEFAULT_EPHEMERAL_PORTS = [32768, 60999]     # Linux's, when the node's could not be read
SPREAD = 16        # more ports a listener holds, spread evenly across its range: a firewall that
                   # opens part of the range shows which part (two random ports find it by luck)


def rank_address(node: NodeFacts, options: Options) -> tuple[str | None, str | None]:
    """The address the ranks will bind there, and its interface: the address Gloo takes on the
    interface preflight chose (GLOO_SOCKET_IFNAME, as the probes' torchrun jobs and launch pin
    it); else what Gloo binds unpinned; else the address the master reached the node at. A node
    whose unpinned bind is wrong (another family, loopback) is address-family's finding: probing
    the address it will use once pinned keeps a firewall there from hiding behind it."""
    iface = toward_master(Context((node,), options), node)     # the choice torchjob.node_env pins
    pinned = _gloo_address(iface) if iface is not None and iface.name != "lo" else None
    if pinned:
        return pinned, iface.name if iface else None
    network = node.parsed.network
    bind = network if isinstance(network, Missing) else network.gloo_bind
    if not isinstance(bind, Missing) and bind.address:
        return bind.address, bind.interface
    return _reached_at(node), None


def unpinned_address(node: NodeFacts, options: Options) -> str | None:
    """The address the ranks bind where nothing pins their interface (a torchrun started without
    GLOO_SOCKET_IFNAME: Gloo binds what the hostname resolves to) when it is the other family on
    the interface preflight pins: an IPv6 hostname on the LAN interface. Its ranks then use that
    family, the pinned ones the other: both are probed, since a firewall is often written for one
    family only. None under --launch (it pins), where the variable is set (the node's own
    environment, --env or the config), or where the unpinned bind is another interface or
    loopback (address-family's and interface-choice's findings, with their pin)."""
    if options.backend != "gloo" or options.launch or options.env.setting(node.node, "GLOO_SOCKET_IFNAME") is not None:
        return None
    network = node.parsed.network
    bind = network if isinstance(network, Missing) else network.gloo_bind
    if isinstance(bind, Missing) or bind.source == "GLOO_SOCKET_IFNAME" or not bind.address:
        return None
    pinned, interface = rank_address(node, options)
    if interface is None or bind.interface != interface or pinned is None or \
            (":" in pinned) == (":" in bind.address):
        return None
    return bind.address


def _gloo_address(iface: Interface) -> str | None:
    """The address Gloo binds on a named interface: its first IPv4, else a global IPv6 (the
    rule node/facts/network.gloo_bind applies to GLOO_SOCKET_IFNAME)."""
    ordered = sorted(iface.addresses, key=lambda a: (a.family, a.scope == "link"))
    return ordered[0].address if ordered else None


def _reached_at(node: NodeFacts) -> str | None:
    reached = node.parsed.reached_at
    return None if isinstance(reached, Missing) else reached


def _ephemeral_ports(node: NodeFacts) -> list[int]:
    network = node.parsed.network
    ports = None if isinstance(network, Missing) else network.ephemeral_ports
    return list(ports) if ports else DEFAULT_EPHEMERAL_PORTS


def _agent(cluster, i: int, spec: dict, timeout: float, on_line=None):
    """The network probe's program on node i (its spec, token included, travels on stdin)."""
    return cluster.job(i, {"program": "netprobe", **spec}, timeout=timeout, on_line=on_line)


class Ready:
    """A node program's READY line, as its on_line callback: `event` is set once it came, with
    `data` (its JSON: the port it listens on, or an error)."""

    def __init__(self):
        self.event, self.data = threading.Event(), None

    def __call__(self, line: str) -> None:
        if line.startswith(protocol.READY):
            self.data = json.loads(line[len(protocol.READY):])
            self.event.set()


def dial_targets(src: str, out: dict, own: set[str], unpinned: dict[str, str], names: list[str],
                 master_addr: str | None, master_port: int) -> list[dict]:
    """What `src` dials: every other node's listener ports (a spread over its range, a closed
    port), its own where it runs more than one rank (`own`: a node's own count, as a hostfile
    gives each host its slots), the other family's listener as unpinned ranks would, and, from a
    worker (`master_addr`), the master port as it will dial it."""
    targets: list[dict] = []
    for dst in names:
        listener = out["listeners"][dst]
        if (dst == src and src not in own) or "ports" not in listener:
            continue
        targets += [{"dst": dst, "address": listener["address"], "port": p, "kind": "listener"}
                    for p in listener["ports"]]
        targets += [{"dst": dst, "address": listener["address"], "port": p, "kind": "listener",
                     "spread": True} for p in listener.get("spread", [])]
        targets += [{"dst": dst, "address": listener["address"], "port": p, "kind": "closed"}
                    for p in listener.get("closed", [])]
        # The other family's listener, dialled as unpinned ranks would: from a node whose own
        # unpinned ranks bind that family too (Gloo pairs one family), or from itself.
        theirs = out.get("unpinned", {}).get(dst, {})
        if "ports" in theirs and (dst == src or (src in unpinned and (":" in unpinned[src]) == (":" in unpinned[dst]))):
            targets += [{"dst": dst, "address": theirs["address"], "port": p, "kind": kind, "unpinned": True}
                        for kind, ports in (("listener", theirs["ports"]), ("closed", theirs.get("closed", [])))
                        for p in ports]
    if master_addr is not None and out["master"] and "error" not in out["master"]:
        # As the worker will dial it: the name or address it is given, resolved there.
        targets.append({"dst": names[0], "address": master_addr, "port": master_port, "kind": "master"})
    return targets


def probe(cluster, nodes: tuple[NodeFacts, ...], options: Options) -> dict:
    usable = [i for i in cluster.usable() if nodes[i].error is None]
    names = {i: nodes[i].node for i in usable}
    # A node with more than one rank (its own count: a hostfile's slots, else nproc_per_node)
    # has its ranks connect to each other on its own address: a path to probe even on one node.
    ranks = {names[i]: options.nproc_on(names[i]) for i in usable}
    own = {i for i in usable if ranks[names[i]] > 1}
    if 0 not in usable or (len(usable) < 2 and 0 not in own):
        return {"skipped": "needs the master and at least one more reachable node"}
    token = secrets.token_hex(16)
    out: dict = {"pairs": [], "listeners": {}, "master": {}, "errors": {}, "nproc_per_node": options.nproc_per_node,
                 "ranks": ranks, "backend": options.backend}

    # 1. Listeners: two kernel-chosen ephemeral ports (as Gloo's) and one closed port per node,
    #    and the master port on the master. A node whose unpinned ranks bind the other family on
    #    the same interface gets a second listener there ("unpinned"): every family a rank uses.
    jobs, ready = {}, {}
    unpinned = {i: a for i in usable if (a := unpinned_address(nodes[i], options))}
    if unpinned:
        out["unpinned"] = {}
    for i, key, address, interface in [
            *((i, "listeners", *rank_address(nodes[i], options)) for i in usable),
            *((i, "unpinned", unpinned[i], rank_address(nodes[i], options)[1]) for i in unpinned)]:
        port_range = _ephemeral_ports(nodes[i])
        ready[i, key] = Ready()
        spec = {"mode": "listen", "address": address, "count": 2, "closed": 1, "token": token,
                "range": port_range, "duration": 60, "spread": SPREAD}
        jobs[i, key] = _agent(cluster, i, spec, 70, ready[i, key])
        out[key][names[i]] = {"address": address, "interface": interface, "range": port_range}
    master_route = route_to_master(nodes[0])
    master_ip = (None if isinstance(master_route, Missing) else master_route.address) or _reached_at(nodes[0])
    master_ready = Ready()
    master_job = None
    if len(usable) > 1:       # workers dial the master port; one node has none
        master_job = _agent(cluster, 0, {"mode": "listen", "address": master_ip, "ports": [options.master_port],
                                         "closed": 0, "token": token, "duration": 60}, 70, master_ready)
    try:
        for (i, key), one in ready.items():
            if not one.event.wait(READY_TIMEOUT):
                out["errors"][names[i]] = "the listener did not start"
            elif "error" in one.data:
                out["errors"][names[i]] = one.data["error"]
            else:
                out[key][names[i]].update(one.data)
        if master_job is not None:
            master_ready.event.wait(READY_TIMEOUT)
            out["master"] = {"address": options.master_addr, "ip": master_ip, "port": options.master_port,
                             **(master_ready.data or {"error": "the listener did not start"})}

        # 2. Every node connects to every other node's ports (and to its own, when it runs more
        #    than one rank there), and workers to the master port: all of a node's dials at once.
        connectors = {}
        for i in usable:
            targets = dial_targets(names[i], out, {names[j] for j in own},
                                   {names[j]: a for j, a in unpinned.items()}, [names[j] for j in sorted(usable)],
                                   options.master_addr or master_ip if i != 0 else None, options.master_port)
            if targets:
                connectors[i] = _agent(cluster, i, {"mode": "connect", "targets": targets, "token": token,
                                                    "timeout": CONNECT_TIMEOUT}, 30)
        for i, job in connectors.items():
            result = job.wait(40)
            lines = result.json_lines(protocol.RESULT)
            if not lines:
                out["errors"][names[i]] = f"the connect probe gave no result: {why_ended(result, 30)}"
                continue
            out["pairs"] += [{"src": names[i], **r} for r in lines[-1]]
    finally:
        # 3. Stop every listener; each reports what it accepted and what it turned away.
        for job in [*jobs.values(), *([master_job] if master_job else [])]:
            job.stop()
        for (i, key), job in jobs.items():
            stats = job.wait(15).json_lines(protocol.RESULT)
            if stats:
                out[key][names[i]].update(stats[-1])
        master_stats = master_job.wait(15).json_lines(protocol.RESULT) if master_job else None
        if master_stats:
            out["master"].update(master_stats[-1])
    return out
