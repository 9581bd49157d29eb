"""The seeds' failures, each made real inside one lab node and removable.

A fault's `apply` changes the node and returns undo records; the lab runs them in reverse
to clear it. Each record is plain data, so a crashed process can still be cleaned up."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from .addressing import vpn_ipv6_address
from .errors import LabError
from .nodeexec import in_node
from .route_faults import DEAD_IFACE, RP_IFACE, dead_route, rp_filter, sysctl_value, toward, wrong_route
from .shards import make_mismatched
from .state import LabState, Node
from .system import ip_batch, process_start_ticks, run

FIREWALL_TABLE = "ddp_lab_firewall"
FIREWALL_SELF_TABLE = "filter"     # the Debian default's name: preflight's nft fix pastes as printed
VPN_IFACE = "tailscale0"
WIFI_IFACE = "wlp3s0"         # the seed worker's wireless interface name
DEFAULT_WIFI_RATE = "50mbit"
DEFAULT_BUSY_PORT = "29500"
DEFAULT_JUMBO_MTU = "9000"
LOSSY_TABLE = "ddp_lab_lossy"
LOSSY_OUT_TABLE = "ddp_lab_lossy_out"
DEFAULT_LOSS = "1"            # percent of the node's inbound TCP packets dropped


@dataclass(frozen=True)
class FaultKind:
    name: str
    seed: str                  # which write-up in shared/seeds shows it
    what: str                  # what it does to the node, in one line
    apply: Callable[[LabState, Node, str | None], list[dict]]
    default_param: str | None = None


def ephemeral_range(node: Node) -> tuple[int, int]:
    text = run(["ip", "netns", "exec", node.netns, "cat",
                "/proc/sys/net/ipv4/ip_local_port_range"]).stdout.split()
    return int(text[0]), int(text[1])


FAMILIES = {"ipv4": "meta nfproto ipv4 ", "ipv6": "meta nfproto ipv6 "}


def _drop_ephemeral(node: Node, table: str, exempt_lo: bool, family: str | None = None,
                    keep_open: tuple[int, int] | None = None) -> list[dict]:
    low, high = ephemeral_range(node)
    if family is not None and family not in FAMILIES:
        raise LabError(f"firewall's parameter {family!r} is not one of {', '.join(FAMILIES)} (or none: both)")
    only = FAMILIES.get(family or "", "")
    # Answers and ssh pass, new inbound connections to the ephemeral range (where Gloo
    # listens) are dropped silently, not refused.
    rules = f"""
table inet {table} {{
  chain input {{
    type filter hook input priority filter; policy accept;
    ct state established,related accept
    {'iifname "lo" accept' if exempt_lo else ''}
    tcp dport 22 accept
    {only}tcp dport {low}-{high} {f"tcp dport != {keep_open[0]}-{keep_open[1]} " if keep_open else ""}ct state new drop
  }}
}}
"""
    run(["ip", "netns", "exec", node.netns, "nft", "-f", "-"], input=rules)
    return [{"kind": "nft_table", "netns": node.netns, "family": "inet", "table": table}]


def _firewall(state: LabState, node: Node, param: str | None) -> list[dict]:
    # Like a default ufw, which accepts everything on lo first; PARAM ipv4 or ipv6: that family only
    # (ip6tables and iptables are two rulesets: one of them is often forgotten).
    return _drop_ephemeral(node, FIREWALL_TABLE, exempt_lo=True, family=param)


def _firewall_part(state: LabState, node: Node, param: str | None) -> list[dict]:
    # A ruleset that opens only part of the ephemeral range (PARAM, LOW-HIGH): Gloo's ports, which
    # the kernel picks anywhere in the range, connect or not by chance.
    match = re.fullmatch(r"(\d+)-(\d+)", param or "")
    low, high = ephemeral_range(node)
    if not match or not low <= int(match.group(1)) <= int(match.group(2)) <= high:
        raise LabError(f"firewall-part@{node.name}:{param}: give the part left open as LOW-HIGH inside the node's "
                       f"range {low}-{high}, e.g. firewall-part@{node.name}:40000-45000")
    return _drop_ephemeral(node, FIREWALL_TABLE, exempt_lo=True, keep_open=(int(match.group(1)), int(match.group(2))))


def _firewall_self(state: LabState, node: Node, param: str | None) -> list[dict]:
    # A hand-written ruleset without `iif lo accept`: the node's own connections to its
    # ephemeral ports arrive on lo (to its LAN address too) and are dropped like anyone's,
    # so two ranks on this node cannot connect to each other.
    return _drop_ephemeral(node, FIREWALL_SELF_TABLE, exempt_lo=False)


def _vpn_ipv6(state: LabState, node: Node, param: str | None) -> list[dict]:
    ip_batch([f"tuntap add dev {VPN_IFACE} mode tun",
              f"addr add {vpn_ipv6_address(node.ipv4)}/128 dev {VPN_IFACE} nodad",
              f"link set {VPN_IFACE} up"], netns=node.netns)
    # The hostname now resolves to the VPN address (hosts files are rendered from the faults).
    return [{"kind": "link", "netns": node.netns, "name": VPN_IFACE},
            {"kind": "hosts", "node": node.name}]


def _rename_commands(old: str, new: str, node: Node) -> list[str]:
    # Taking the link down drops its IPv6 address; put it back (IPv4 stays).
    return [f"link set {old} down", f"link set {old} name {new}", f"link set {new} up",
            f"addr replace {node.ipv6}/64 dev {new} nodad"]


def _tbf(rate: str) -> list[str]:
    bits = _rate_bits(rate)
    burst = max(bits // 8 // 100, 16000)      # 10 ms worth of bytes, at least a few packets
    return ["tbf", "rate", rate, "burst", str(burst), "latency", "100ms"]


def _rate_bits(rate: str) -> int:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(kbit|mbit|gbit)", rate)
    if not match:
        raise LabError(f"wifi rate {rate!r} is not understood: write it like 50mbit, 800kbit or 1gbit")
    scale = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[match.group(2)]
    return int(float(match.group(1)) * scale)


def _wifi(state: LabState, node: Node, param: str | None) -> list[dict]:
    rate = param or DEFAULT_WIFI_RATE
    shape = _tbf(rate)
    old = node.iface
    ip_batch(_rename_commands(old, WIFI_IFACE, node), netns=node.netns)
    node.iface = WIFI_IFACE
    undo = [{"kind": "rename", "node": node.name, "from": WIFI_IFACE, "to": old}]
    # Both directions: the node's sending side, and the switch port that sends to it.
    run(["tc", "-n", node.netns, "qdisc", "replace", "dev", WIFI_IFACE, "root", *shape])
    undo.append({"kind": "qdisc", "netns": node.netns, "dev": WIFI_IFACE})
    run(["tc", "-n", state.switch_netns, "qdisc", "replace", "dev", node.switch_port, "root", *shape])
    undo.append({"kind": "qdisc", "netns": state.switch_netns, "dev": node.switch_port})
    return undo


def _lossy_out(state: LabState, node: Node, param: str | None) -> list[dict]:
    # nftables drops a random share of the TCP packets the node sends (ssh aside), on its own
    # output: its kernel sends them again as if new, counting no resend.
    return _lossy(state, node, param, hook="output", table=LOSSY_OUT_TABLE)


def _lossy(state: LabState, node: Node, param: str | None, hook: str = "input",
           table: str = LOSSY_TABLE) -> list[dict]:
    # nftables drops a random share of the TCP packets that reach the node (ssh aside, so the lab
    # stays in hand): a bad cable, NIC or Wi-Fi, as the node's peers' retransmissions show it.
    # tc netem cannot run here; nft's random number can.
    try:
        percent = float(param or DEFAULT_LOSS)
    except ValueError:
        percent = -1.0
    if not 0 < percent < 100:
        raise LabError(f"{'lossy' if hook == 'input' else 'lossy-out'}: {param!r} is not a percent between 0 and 100, "
                       f"e.g. {'lossy' if hook == 'input' else 'lossy-out'}@worker1:1")
    per_mille = max(1, round(percent * 10))
    rules = f"""
table inet {table} {{
  chain {hook} {{
    type filter hook {hook} priority filter; policy accept;
    {'iifname' if hook == 'input' else 'oifname'} "lo" accept
    tcp dport 22 accept
    tcp sport 22 accept
    meta l4proto tcp numgen random mod 1000 < {per_mille} drop
  }}
}}
"""
    run(["ip", "netns", "exec", node.netns, "nft", "-f", "-"], input=rules)
    return [{"kind": "nft_table", "netns": node.netns, "family": "inet", "table": table}]


def _loopback_host(state: LabState, node: Node, param: str | None) -> list[dict]:
    return [{"kind": "hosts", "node": node.name}]


def _ipv6_host(state: LabState, node: Node, param: str | None) -> list[dict]:
    # The hosts files are rendered from the faults (lab/hosts.py): the node's name, to its eth0's IPv6.
    return [{"kind": "hosts", "node": node.name}]


def _ipv6_off(state: LabState, node: Node, param: str | None) -> list[dict]:
    # IPv6 off in the node's kernel, as a hardening guide does it: the node loses its IPv6
    # addresses and routes (its eth0's static one included, which its undo puts back).
    keys = ["net.ipv6.conf.all.disable_ipv6", "net.ipv6.conf.default.disable_ipv6"]
    undo = [{"kind": "ipv6_address", "netns": node.netns, "dev": node.iface, "address": f"{node.ipv6}/64"}]
    undo += [{"kind": "sysctl", "netns": node.netns, "key": key, "value": sysctl_value(node.netns, key)} for key in keys]
    run(["ip", "netns", "exec", node.netns, "sysctl", "-q", "-w", *(f"{key}=1" for key in keys)])
    return undo


def _stale_hosts(state: LabState, node: Node, param: str | None) -> list[dict]:
    # The hosts files are rendered from the faults (lab/hosts.py): the master's name (or PARAM's)
    # points at an address of the lab's LAN where nothing answers, as a line kept from before a
    # machine moved does.
    toward(state, node, param, "stale-hosts")
    return [{"kind": "hosts", "node": node.name}]


LEFTOVER_SCRIPT = """\
# A training run's leftover: it still holds the rendezvous port.
import socket, sys, time
port = int(sys.argv[sys.argv.index("--master-port") + 1])
server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as torch's TCPStore does
server.bind(("0.0.0.0", port))
server.listen(16)
while True:
    time.sleep(3600)
"""


def _port_busy(state: LabState, node: Node, param: str | None) -> list[dict]:
    port = param or DEFAULT_BUSY_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise LabError(f"port-busy@{node.name}:{port}: the port must be a number from 1 to 65535")
    script = state.node_dir(node.name) / "train.py"
    script.write_text(LEFTOVER_SCRIPT)
    proc = subprocess.Popen(in_node(state, node, [sys.executable, str(script),
                                                  "--master-port", port]),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    undo = [{"kind": "process", "pid": proc.pid, "start": process_start_ticks(proc.pid) or 0}]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection((node.ipv4, int(port)), timeout=0.5).close()
            proc.returncode = 0   # it outlives us on purpose: no one waits for it here
            return undo
        except OSError:
            time.sleep(0.05)
    raise LabError(f"port-busy@{node.name}: the leftover process did not take port {port}"
                   + (" (something else holds it)" if proc.poll() is not None else ""))


def _mtu_blackhole(state: LabState, node: Node, param: str | None) -> list[dict]:
    mtu = param or DEFAULT_JUMBO_MTU
    if not mtu.isdigit() or not 1500 < int(mtu) <= 65535:
        raise LabError(f"mtu-blackhole@{node.name}:{mtu}: the MTU must be a number from 1501 to 65535 "
                       "(the switch's ports stay at 1500)")
    link = json.loads(run(["ip", "-n", node.netns, "-j", "-d", "link", "show", "dev", node.iface]).stdout)[0]
    undo = [{"kind": "link_mtu", "netns": node.netns, "dev": node.iface, "mtu": link["mtu"],
             "gso_max_segs": link.get("gso_max_segs", 65535)}]
    # Jumbo frames on the node, its switch port left at 1500: the bridge drops every larger frame
    # and sends no ICMP. One TCP segment per packet, as on a real wire: veth passes a GSO
    # super-packet of any size through the bridge, and TCP's bulk transfers would slip past.
    ip_batch([f"link set dev {node.iface} mtu {mtu} gso_max_segs 1"], netns=node.netns)
    return undo


def _shards(state: LabState, node: Node, param: str | None) -> list[dict]:
    make_mismatched(state.path / "dataset", state.node_dir(node.name) / "data", state.shard_count)
    return [{"kind": "shards", "node": node.name}]


FAULTS: dict[str, FaultKind] = {f.name: f for f in [
    FaultKind("firewall", "002", "nftables drops new inbound TCP to the node's ephemeral ports "
              "(ssh and established traffic pass), like a default ufw; PARAM ipv4 or ipv6: that family only",
              _firewall),
    FaultKind("firewall-part", "none: issue 38", "like firewall, leaving open only PARAM (LOW-HIGH) of the "
              "ephemeral range, e.g. firewall-part@worker1:40000-45000", _firewall_part),
    FaultKind("firewall-self", "002, ranks on one node", "like firewall, without exempting lo: the node's own new "
              "connections to its ephemeral ports (to its LAN address too) are dropped, so its ranks cannot "
              "connect to each other", _firewall_self),
    FaultKind("vpn-ipv6", "004", f"adds {VPN_IFACE} with only an IPv6 address and makes the "
              "hostname resolve to it, so Gloo binds IPv6 there", _vpn_ipv6),
    FaultKind("wifi", "001, 004", f"renames the LAN interface to {WIFI_IFACE} and shapes it both "
              "ways with tc tbf (default 50mbit)", _wifi, DEFAULT_WIFI_RATE),
    FaultKind("dead-route", "none: issue 26", f"adds {DEAD_IFACE} (a veth whose other end is down: no carrier) and a "
              "host route to the master (or to the node PARAM names: dead-route@worker1:worker2) through it: the kernel "
              "picks it and the node's connections there go nowhere", dead_route),
    FaultKind("rp-filter", "none: issue 26", f"adds {RP_IFACE} (a direct link to the master, or to the node PARAM "
              "names: rp-filter@worker1:worker2) and a host route to it through that link, and makes the node's "
              "reverse-path filter strict (rp_filter 1): that node's packets still arrive on the LAN interface, and "
              "the node drops them", rp_filter),
    FaultKind("wrong-route", "none: issue 38", f"adds {DEAD_IFACE} (a veth, up, carrying, leading nowhere) and a host "
              "route to the master (or to the node PARAM names) through it, which takes over the LAN's: the node's "
              "connections there go nowhere", wrong_route),
    FaultKind("lossy", "none: issue 26", "nftables drops PARAM percent (default 1) of the TCP packets that "
              "reach the node, ssh aside: a lossy cable, NIC or Wi-Fi", _lossy, DEFAULT_LOSS),
    FaultKind("lossy-out", "none: issue 38", "nftables drops PARAM percent (default 1) of the TCP packets the node "
              "sends, ssh aside, on its own output: its kernel sends them again as if new", _lossy_out, DEFAULT_LOSS),
    FaultKind("loopback-host", "Debian default", "the hostname resolves to 127.0.1.1, so Gloo "
              "binds loopback", _loopback_host),
    FaultKind("ipv6-host", "issue 26", "the hostname resolves to the node's LAN IPv6 address (its eth0 carries one), "
              "so Gloo binds IPv6 there, reachable from the other nodes; on every node: an IPv6 cluster",
              _ipv6_host),
    FaultKind("ipv6-off", "none: issue 38", "turns IPv6 off in the node's kernel (net.ipv6.conf.all.disable_ipv6 = 1, "
              "and default): it loses its IPv6 addresses and routes, so an IPv6 master address is unreachable "
              "from it", _ipv6_off),
    FaultKind("stale-hosts", "none: issue 38", "the node's /etc/hosts maps the master's name (or PARAM's: "
              "stale-hosts@worker1:worker2) to an address of the LAN where nothing answers, a line kept from before "
              "a machine moved", _stale_hosts),
    FaultKind("port-busy", "002", "a leftover train.py process holds the master port "
              "(default 29500)", _port_busy, DEFAULT_BUSY_PORT),
    FaultKind("mtu-blackhole", "none: issue 17", "sets the node's LAN interface to MTU 9000 (or PARAM) "
              "while its switch port stays at 1500: larger packets vanish without an ICMP reply", _mtu_blackhole,
              DEFAULT_JUMBO_MTU),
    FaultKind("shards", "001, 004", "the node's data folder holds fewer shards than the "
              "master's, and one of them differs", _shards),
]}


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    node: str
    param: str | None

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        match = re.fullmatch(r"([a-z0-9-]+)@([a-z0-9]+)(?::([A-Za-z0-9.-]+))?", text)
        if not match:
            raise LabError(f"fault {text!r} is not FAULT@NODE[:PARAM], e.g. firewall@worker1 "
                           "or wifi@worker1:100mbit")
        kind, node, param = match.groups()
        if kind not in FAULTS:
            raise LabError(f"unknown fault {kind!r}: choose from {', '.join(FAULTS)}")
        return cls(kind, node, param)
