"""Pick lab subnets that clash with nothing on the host and with no other lab."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass

from .errors import LabError
from .system import run

# Candidates: 10.213.K.0/24 and fd64:6470:213:K::/64 (0x6470 is "dp"). The lab never routes
# anywhere: nodes get no default route, so traffic stays on the lab's own bridge.
IPV4_TEMPLATE = "10.213.{k}.0/24"
IPV6_TEMPLATE = "fd64:6470:213:{k:x}::/64"
MASTER_HOST = 200      # the master has the highest address, as in seed 002 (.36 vs .28):
WORKER_BASE = 10       # Gloo's lower address listens, so a worker's firewall blocks the master.
OPERATOR_HOST = 1      # this machine's own address on the lab LAN (where ssh comes from)
MAX_NODES = 16


@dataclass(frozen=True)
class Plan:
    subnet4: ipaddress.IPv4Network
    subnet6: ipaddress.IPv6Network

    def host_octet(self, index: int) -> int:
        return MASTER_HOST if index == 0 else WORKER_BASE + index

    def node_ipv4(self, index: int) -> str:
        return str(self.subnet4.network_address + self.host_octet(index))

    def node_ipv6(self, index: int) -> str:
        # The same decimal digits as the IPv4 host part, so addresses are easy to pair by eye.
        return str(ipaddress.IPv6Address(f"{self.subnet6.network_address}{self.host_octet(index)}"))

    @property
    def operator_ipv4(self) -> str:
        return str(self.subnet4.network_address + OPERATOR_HOST)

    @property
    def operator_ipv6(self) -> str:
        return str(self.subnet6.network_address + OPERATOR_HOST)


def host_networks() -> list[tuple[ipaddress._BaseNetwork, str]]:
    """Every network the host already uses: its addresses and its routes, with where from."""
    used: list[tuple[ipaddress._BaseNetwork, str]] = []
    for entry in json.loads(run(["ip", "-j", "addr"]).stdout or "[]"):
        for addr in entry.get("addr_info", []):
            net = ipaddress.ip_network(f"{addr['local']}/{addr['prefixlen']}", strict=False)
            if not net.is_link_local and not net.is_loopback:
                used.append((net, f"{entry['ifname']} address {addr['local']}"))
    for family in ("-4", "-6"):
        routes = json.loads(run(["ip", "-j", family, "route", "show", "table", "all"],
                                check=False).stdout or "[]")
        for route in routes:
            dst = route.get("dst", "")
            if dst in ("default", "") or route.get("type") in ("local", "broadcast", "multicast"):
                continue
            try:
                net = ipaddress.ip_network(dst, strict=False)
            except ValueError:
                continue
            if not net.is_link_local and not net.is_loopback and not net.is_multicast:
                used.append((net, f"route {dst} via {route.get('dev', '?')}"))
    return used


def choose(other_labs: list[tuple[str, str]], requested4: str | None = None) -> Plan:
    """A plan whose subnets overlap no host network and no other lab's.

    `other_labs` holds (subnet4, subnet6) of labs that are up. With `requested4`, use that IPv4
    subnet or explain in one line why not."""
    used = host_networks() + [
        (ipaddress.ip_network(net), "another lab") for pair in other_labs for net in pair]

    def clash(net: ipaddress._BaseNetwork) -> str | None:
        for other, where in used:
            if other.version == net.version and net.overlaps(other):
                return where
        return None

    if requested4 is not None:
        try:
            subnet4 = ipaddress.IPv4Network(requested4, strict=True)
        except ValueError as exc:
            raise LabError(f"--subnet {requested4}: {exc}; give an IPv4 /24 such as 10.213.7.0/24") from None
        if subnet4.prefixlen > 24:
            raise LabError(f"--subnet {requested4} is too small for {MAX_NODES} nodes: use a /24")
        where = clash(subnet4)
        if where:
            raise LabError(f"--subnet {requested4} clashes with the host's {where}; "
                           "pick a free one, or leave --subnet out to choose automatically")
        for k in range(256):
            subnet6 = ipaddress.IPv6Network(IPV6_TEMPLATE.format(k=k))
            if not clash(subnet6):
                return Plan(subnet4, subnet6)
    for k in range(256):
        subnet4 = ipaddress.IPv4Network(IPV4_TEMPLATE.format(k=k))
        subnet6 = ipaddress.IPv6Network(IPV6_TEMPLATE.format(k=k))
        if not clash(subnet4) and not clash(subnet6):
            return Plan(subnet4, subnet6)
    raise LabError("no free lab subnet under 10.213.0.0/16: pass one with --subnet CIDR")


def vpn_ipv6_address(node_ipv4: str) -> str:
    """The tailscale-style address the vpn-ipv6 fault gives a node (Tailscale's own ULA prefix)."""
    return f"fd7a:115c:a1e0::{node_ipv4.rsplit('.', 1)[1]}"
