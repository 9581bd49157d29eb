"""Interfaces, what the hostname resolves to, what Gloo will bind, the route to the master,
reverse-path filtering, the ephemeral port range and the firewall."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket

from ..proc import read, reverse_path_drops
from .util import command

VPN_NAMES = re.compile(r"^(tailscale|wg|zt|tun|utun|tap|ppp|ipsec|nordlynx|proton)")
BRIDGE_NAMES = re.compile(r"^(docker|br-|virbr|lxcbr|lxdbr|cni|flannel|cali|vmnet|vboxnet)")
WIRELESS_NAMES = re.compile(r"^(wl|wlan|wifi|ath|ra\d)")
TUNNEL_KINDS = {"tun", "wireguard", "ipip", "gre", "sit", "vxlan", "geneve", "ip6tnl", "ipvlan"}


def classify(name: str, kind: str | None, flags: list[str]) -> str:
    """The interface's kind in the user's words."""
    if "LOOPBACK" in flags or name == "lo":
        return "loopback"
    if os.path.isdir(f"/sys/class/net/{name}/wireless") or os.path.exists(
            f"/sys/class/net/{name}/phy80211") or WIRELESS_NAMES.match(name):
        return "wireless"
    if kind in TUNNEL_KINDS or VPN_NAMES.match(name) or "POINTOPOINT" in flags:
        return "vpn"
    if BRIDGE_NAMES.match(name):
        return "docker/bridge"
    if kind == "bridge":
        return "bridge"
    if kind == "veth":
        return "veth"
    if kind in ("dummy", "macvlan", "vlan", "bond", "team"):
        return kind
    return "ethernet"


def _speed(name: str) -> int | None:
    text = read(f"/sys/class/net/{name}/speed")
    try:
        value = int(text) if text else -1
    except ValueError:
        return None
    return value if value > 0 else None


def rp_filter(name: str) -> int | None:
    """The interface's reverse-path filter for IPv4 as the kernel applies it: the larger of
    net.ipv4.conf.all.rp_filter and its own (0 off, 1 strict: a packet that arrives on another
    interface than the route back to its sender uses is dropped, 2 loose); None where unreadable."""
    values = []
    for conf in ("all", name):
        text = read(f"/proc/sys/net/ipv4/conf/{conf}/rp_filter")
        try:
            values.append(int(text or ""))
        except ValueError:
            return None
    return max(values)


def disable_ipv6(conf: str) -> int | None:
    """net.ipv6.conf.CONF.disable_ipv6 (1: IPv6 off there); 1 for a kernel without IPv6 at all;
    None: not readable."""
    if not os.path.isdir("/proc/sys/net/ipv6"):
        return 1
    text = read(f"/proc/sys/net/ipv6/conf/{conf}/disable_ipv6")
    try:
        return int(text.strip()) if text else None
    except ValueError:
        return None


def interfaces() -> list[dict]:
    done = command(["ip", "-j", "-d", "addr", "show"])
    if done is None or done.returncode != 0:
        return _interfaces_from_sysfs()
    result = []
    shaped = shapers()
    for link in json.loads(done.stdout or "[]"):
        name = link["ifname"]
        kind = (link.get("linkinfo") or {}).get("info_kind")
        flags = link.get("flags", [])
        addrs = [{"family": 6 if a["family"] == "inet6" else 4, "address": a["local"],
                  "prefixlen": a.get("prefixlen"), "scope": a.get("scope")}
                 for a in link.get("addr_info", []) if a.get("family") in ("inet", "inet6")]
        result.append({"name": name, "kind": classify(name, kind, flags), "link_kind": kind,
                       # Administratively up with a carrier: a link whose peer or cable is gone
                       # (NO-CARRIER, LOWERLAYERDOWN) carries nothing, whatever routes point at it.
                       "up": "UP" in flags and "NO-CARRIER" not in flags
                             and link.get("operstate") not in ("DOWN", "LOWERLAYERDOWN", "NOTPRESENT"),
                       "operstate": link.get("operstate"), "mtu": link.get("mtu"),
                       "speed_mbit": _speed(name), "rp_filter": rp_filter(name), "addresses": addrs,
                       "disable_ipv6": disable_ipv6(name) if name != "lo" else None,
                       **({"shaper": shaped[name]} if name in shaped else {})})
    return result


def shapers() -> dict[str, dict]:
    """Each interface whose root queueing discipline caps what it sends at a rate (tbf's rate,
    cake's bandwidth, in bytes/s as tc reports them): a node slower than its link's nominal speed
    for that reason alone, whatever the wire. Empty without tc."""
    done = command(["tc", "-j", "qdisc", "show"])
    if done is None or done.returncode != 0:
        return {}
    try:
        qdiscs = json.loads(done.stdout or "[]")
    except ValueError:
        return {}
    out = {}
    for q in qdiscs if isinstance(qdiscs, list) else []:
        options = q.get("options") or {}
        cap = options.get("rate") if q.get("kind") == "tbf" else options.get("bandwidth")
        if q.get("root") and q.get("dev") and isinstance(cap, int) and cap > 0:
            out[q["dev"]] = {"kind": q.get("kind"), "rate_bytes_per_s": cap}
    return out


def _interfaces_from_sysfs() -> list[dict]:
    """Without iproute2: names, kinds and IPv6 addresses from /proc (IPv4 needs `ip`)."""
    v6: dict[str, list[dict]] = {}
    for line in (read("/proc/net/if_inet6", "") or "").splitlines():
        hexaddr, _, plen, scope, _, name = line.split()
        addr = str(ipaddress.IPv6Address(bytes.fromhex(hexaddr)))
        v6.setdefault(name, []).append({"family": 6, "address": addr, "prefixlen": int(plen, 16),
                                        "scope": "link" if scope == "20" else "global"})
    result = []
    for _, name in socket.if_nameindex():
        flags = ["LOOPBACK"] if name == "lo" else []
        up = (read(f"/sys/class/net/{name}/operstate", "") or "").strip() in ("up", "unknown")
        result.append({"name": name, "kind": classify(name, None, flags), "link_kind": None,
                       "up": up, "operstate": None, "mtu": None, "speed_mbit": _speed(name),
                       "rp_filter": rp_filter(name), "addresses": v6.get(name, []), "partial": "IPv4 addresses need iproute2"})
    return result


def resolve(name: str) -> list[dict]:
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return [{"error": str(exc)}]
    seen, out = set(), []
    for family, _, _, _, sockaddr in infos:
        if sockaddr[0] not in seen:
            seen.add(sockaddr[0])
            out.append({"family": 6 if family == socket.AF_INET6 else 4, "address": sockaddr[0]})
    return out


def _bindable(family: int, address: str) -> bool:
    sock = socket.socket(socket.AF_INET6 if family == 6 else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((address, 0))
        return True
    except OSError:
        return False
    finally:
        sock.close()


def gloo_bind(ifaces: list[dict], hostname: str, env: dict) -> dict:
    """The address Gloo will bind, by Gloo's own rule: GLOO_SOCKET_IFNAME's interface
    (its first IPv4 address, else IPv6), else the first address the hostname resolves to
    that can be bound, else loopback."""
    ifname = env.get("GLOO_SOCKET_IFNAME")
    if ifname:
        first = ifname.split(",")[0]
        for iface in ifaces:
            if iface["name"] == first:
                ordered = sorted(iface["addresses"], key=lambda a: (a["family"], a["scope"] == "link"))
                if ordered:
                    a = ordered[0]
                    return {"source": "GLOO_SOCKET_IFNAME", "interface": first,
                            "family": a["family"], "address": a["address"]}
        return {"source": "GLOO_SOCKET_IFNAME", "interface": first, "family": None,
                "address": None, "error": f"GLOO_SOCKET_IFNAME={first} names no interface with an address"}
    for entry in resolve(hostname):
        if "error" in entry:
            break
        if _bindable(entry["family"], entry["address"]):
            return {"source": "hostname", "hostname": hostname, "interface": interface_of(ifaces, entry["address"]),
                    "family": entry["family"], "address": entry["address"]}
    return {"source": "fallback", "hostname": hostname, "interface": "lo", "family": 4,
            "address": "127.0.0.1"}


def interface_of(ifaces: list[dict], address: str) -> str | None:
    if address.startswith("127."):
        return "lo"
    for iface in ifaces:
        if any(a["address"] == address for a in iface["addresses"]):
            return iface["name"]
    return None


def route_to(address: str | None) -> dict | None:
    if not address:
        return None
    resolved = resolve(address)
    if resolved and "error" in resolved[0]:
        return {"target": address, "error": f"{address} does not resolve here: {resolved[0]['error']}"}
    ip = resolved[0]["address"]
    done = command(["ip", "-j", "-d", "route", "get", ip])      # -d: the table it came from
    if done is None:
        return {"target": address, "address": ip, "error": "iproute2 is not installed"}
    if done.returncode != 0:
        return {"target": address, "address": ip, "error": (done.stderr or "no route").strip()}
    route = (json.loads(done.stdout or "[]") or [{}])[0]
    table = str(route["table"]) if route.get("table") not in (None, "main") else None
    prefix, flags, then = _picked(ip, route.get("dev"), table)
    if table is not None:
        # Once deleted there, the lookup falls through to the main table: its route then serves.
        main = _main_route(ip)
        then = main if main != route.get("dev") else then
    return {"target": address, "address": ip, "interface": route.get("dev"),
            "source": route.get("prefsrc"), "gateway": route.get("gateway"),
            "flags": sorted(set(route.get("flags") or []) | set(flags)), "prefix": prefix,
            # A route that policy routing picked from another table: `ip route del PREFIX` would not
            # name it, and the main table's next route is not the one that would serve.
            **({"table": str(route["table"])} if route.get("table") not in (None, "main") else {}),
            "then_interface": then}


def _main_route(ip: str) -> str | None:
    """The interface of the main table's route to `ip` (the most specific, then the lowest metric)."""
    done = command(["ip", "-j", "route", "show", "table", "main", "match", ip])
    if done is None or done.returncode != 0:
        return None
    try:
        routes = [r for r in json.loads(done.stdout or "[]") if r.get("dst") and r.get("dev")]
    except ValueError:
        return None
    best = max(routes, key=_order, default=None)
    return best.get("dev") if best else None


def _order(route: dict) -> tuple[int, int]:
    """The kernel's order: the longest prefix, then the lowest metric."""
    dst = route["dst"]
    length = 0 if dst == "default" else int(dst.split("/", 1)[1]) if "/" in dst else (128 if ":" in dst else 32)
    metric = route.get("metric")
    return length, -(metric if isinstance(metric, int) else 0)


def _picked(ip: str, dev: str | None, table: str | None = None) -> tuple[str | None, list[str], str | None]:
    """The route the kernel picked, as its table holds it (the main one unless policy routing
    picked another): its destination (the most specific one through that interface that holds
    the address: "10.0.0.7", "10.0.0.0/24", "default"), as `ip route del` takes it, its flags
    ("linkdown": its interface has no carrier, which `ip route get` does not say), and the
    interface of the route that serves once it is deleted (the next most specific one); (None,
    [], None) when it cannot be told."""
    done = command(["ip", "-j", "route", "show", *(["table", table] if table else []), "match", ip])
    if done is None or done.returncode != 0 or not dev:
        return None, [], None
    try:
        routes = [r for r in json.loads(done.stdout or "[]") if r.get("dst")]
    except ValueError:
        return None, [], None

    best = max((r for r in routes if r.get("dev") == dev), key=_order, default=None)
    if best is None:
        return None, [], None
    then = max((r for r in routes if r is not best), key=_order, default=None)
    return best["dst"], list(best.get("flags") or []), then.get("dev") if then else None


def port_range() -> list[int] | None:
    text = read("/proc/sys/net/ipv4/ip_local_port_range")
    return [int(x) for x in text.split()] if text else None


def firewall() -> dict:
    """The firewall as far as it can be read here; reading it needs root."""
    out: dict = {"readable": False}
    nft = command(["nft", "list", "ruleset"])
    if nft is not None:
        if nft.returncode == 0:
            text = nft.stdout
            out.update(readable=True, tool="nftables", rules=text[:20000],
                       input_drops=len(re.findall(r"\b(drop|reject)\b", text)),
                       input_policy_drop=bool(re.search(r"hook input.*policy drop", text)))
        else:
            out["reason"] = (nft.stderr or "").strip().splitlines()[-1:] or ["nft failed"]
    ufw = command(["ufw", "status"])
    if ufw is not None and ufw.returncode == 0:
        out["ufw"] = ufw.stdout.strip()[:4000]
        out["readable"] = True
    if not out["readable"] and os.geteuid() != 0:
        out["reason"] = "reading the firewall needs root"
    return out


def network_facts(request: dict, env: dict) -> dict:
    ifaces = interfaces()
    hostname = socket.gethostname()
    return {"hostname": hostname, "fqdn": socket.getfqdn(), "interfaces": ifaces,
            "hostname_resolves_to": resolve(hostname),
            "gloo_bind": gloo_bind(ifaces, hostname, env),
            "route_to_master": route_to(request.get("master_addr")),
            "rp_filter_drops": reverse_path_drops(), "disable_ipv6": disable_ipv6("all"),
            "ephemeral_ports": port_range(), "firewall": firewall()}
