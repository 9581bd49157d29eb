"""Interfaces, the address Gloo will bind, the route to the master, reverse-path filtering, the
ephemeral ports and the firewall (node/facts/network.py)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .read import Missing, Sent, Unreadable, flag, kind, objects, part, required, sent_of, text, texts, whole


@dataclass(frozen=True)
class Address:
    family: int                  # 4 or 6
    address: str
    prefixlen: int | None = None
    scope: str | None = None     # "global", "link", "host"

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> Address:
        return cls(required(whole(wire, "family"), "family"), required(text(wire, "address"), "address"),
                   whole(wire, "prefixlen"), text(wire, "scope"))


@dataclass(frozen=True)
class Interface:
    name: str
    kind: str                    # in the user's words: "ethernet", "wireless", "vpn", "loopback" ...
    up: bool
    addresses: tuple[Address, ...]
    speed_mbit: int | None = None   # in Mbit/s; None: the link does not say (virtual, or down)
    rp_filter: int | None = None    # IPv4 reverse-path filter as applied, max(all, its own): 0 off, 1 strict,
                                    # 2 loose; None: not read (an older node, or unreadable)
    shaper: str | None = None       # its root qdisc that caps what it sends ("tbf", "cake"); None: none seen
    shaper_rate: int | None = None  # in bytes/s: that cap
    disable_ipv6: int | None = None  # net.ipv6.conf.NAME.disable_ipv6 (1: IPv6 off on it); None: not read

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> Interface:
        found = wire.get("shaper")
        shaper: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        return cls(required(text(wire, "name"), "name"), required(text(wire, "kind"), "kind"), flag(wire, "up"),
                   objects(wire, "addresses", Address.from_json), whole(wire, "speed_mbit"),
                   whole(wire, "rp_filter"), text(shaper, "kind"), whole(shaper, "rate_bytes_per_s"),
                   whole(wire, "disable_ipv6"))


@dataclass(frozen=True)
class GlooBind(Sent):
    """The address Gloo will bind on the node, by Gloo's own rule."""
    source: Literal["GLOO_SOCKET_IFNAME", "hostname", "fallback"]
    interface: str | None        # None: no interface holds the address
    family: int | None           # 4 or 6; None with `error`
    address: str | None
    hostname: str | None = None  # what was resolved (source hostname or fallback)
    error: str | None = None     # GLOO_SOCKET_IFNAME names no interface with an address

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> GlooBind:
        source = wire.get("source")
        if source not in ("GLOO_SOCKET_IFNAME", "hostname", "fallback"):
            raise Unreadable(f"source {source!r} is not one this version knows")
        return cls(source, text(wire, "interface"), whole(wire, "family"), text(wire, "address"),
                   text(wire, "hostname"), text(wire, "error"), sent=sent_of(wire))


@dataclass(frozen=True)
class Route(Sent):
    """How the node reaches the master's address (`ip route get`)."""
    target: str | None           # the master's address as given
    address: str | None          # what it resolved to there
    interface: str | None = None
    error: str | None = None     # it does not resolve there, or no route
    prefix: str | None = None    # the route's destination as `ip route del` takes it ("10.0.0.7", "default")
    flags: tuple[str, ...] = ()  # the kernel's word on it ("linkdown": its interface has no carrier)
    source: str | None = None    # the node's address it sends from (the master answers to it)
    table: str | None = None     # a table other than main that policy routing picked it from
    then_interface: str | None = None   # the interface of the main table's next route, which serves once
                                        # this one is deleted; None: none, or not told

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> Route:
        return cls(text(wire, "target"), text(wire, "address"), text(wire, "interface"), text(wire, "error"),
                   text(wire, "prefix"), texts(wire, "flags"), text(wire, "source"), text(wire, "table"),
                   text(wire, "then_interface"), sent=sent_of(wire))


@dataclass(frozen=True)
class Firewall:
    readable: bool               # reading it needs root
    tool: str | None = None      # "nftables"
    input_drops: int = 0         # drop or reject rules in the ruleset
    input_policy_drop: bool = False
    input_chains: tuple[str, ...] = ()   # nftables' chains on the input hook ("inet filter input"), those that
                                         # drop or reject first
    random_drops: tuple[RandomDrop, ...] = ()   # rules that drop a random share of what passes

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> Firewall:
        rules = text(wire, "rules") or ""
        return cls(flag(wire, "readable"), text(wire, "tool"), whole(wire, "input_drops") or 0,
                   flag(wire, "input_policy_drop"), input_chains(rules), random_drops(rules))

    @property
    def input_chain(self) -> str:
        """Where an accept rule goes ("FAMILY TABLE CHAIN" for `nft insert rule`): the input chain
        that drops, as the ruleset names it; Debian's and most distributions' default when the
        ruleset was not read."""
        return self.input_chains[0] if self.input_chains else "inet filter input"


@dataclass(frozen=True)
class RandomDrop:
    """An nftables rule that drops a random share of the packets it sees (`numgen random mod 100 <
    5 drop`; iptables' `-m statistic --mode random` as iptables-nft lists it): a lossy path of the
    node's own making, whatever the wire."""
    chain: str                   # "family table chain", as `nft delete rule` takes it
    hook: str | None             # "input", "output", "forward"...; None: a chain no hook calls directly
    rule: str                    # the rule as `nft list ruleset` prints it


def random_drops(rules: str) -> tuple[RandomDrop, ...]:
    found: list[RandomDrop] = []
    table = chain = hook = None
    for line in rules.splitlines():
        words = line.split()
        if len(words) >= 3 and words[0] == "table" and words[-1] == "{":
            table, chain = " ".join(words[1:3]) if len(words) == 4 else f"ip {words[1]}", None
        elif len(words) == 3 and words[0] == "chain" and words[2] == "{":
            chain, hook = words[1], None
        elif chain is not None and (m := re.search(r"\bhook (\w+)", line)) and line.strip().startswith("type "):
            hook = m.group(1)
        elif table and chain and re.search(r"\b(numgen random|statistic)\b", line) and re.search(r"\bdrop\s*$", line):
            found.append(RandomDrop(f"{table} {chain}", hook, line.strip()))
    return tuple(found)


def input_chains(rules: str) -> tuple[str, ...]:
    """The chains of an `nft list ruleset` on the input hook, as "family table chain", those with
    a drop or reject (a rule or the policy) first."""
    found: list[tuple[bool, str]] = []
    table = chain = None
    body: list[str] = []

    def close() -> None:
        joined = "\n".join(body)
        if table and chain and re.search(r"\bhook input\b", joined):
            found.append((not re.search(r"\b(drop|reject)\b", joined), f"{table} {chain}"))

    for line in rules.splitlines():
        words = line.split()
        if len(words) >= 3 and words[0] == "table" and words[-1] == "{":
            close()
            table, chain = " ".join(words[1:3]) if len(words) == 4 else f"ip {words[1]}", None
        elif len(words) == 3 and words[0] == "chain" and words[2] == "{":
            close()
            chain, body = words[1], []
        elif chain is not None:
            body.append(line)
    close()
    return tuple(name for _, name in sorted(found, key=lambda f: f[0]))


def _port_range(wire: Mapping[str, Any]) -> tuple[int, int] | None:
    value = kind(wire, "ephemeral_ports", (list, tuple), "a list")
    if value is None:
        return None
    if len(value) != 2 or not all(isinstance(v, int) for v in value):
        raise Unreadable("ephemeral_ports is not [low, high]")
    return value[0], value[1]


@dataclass(frozen=True)
class NetworkFacts:
    hostname: str | None
    interfaces: tuple[Interface, ...]
    gloo_bind: GlooBind | Missing
    route_to_master: Route | Missing         # Missing: no master address was given to the node
    ephemeral_ports: tuple[int, int] | None  # (low, high); None: not readable there
    firewall: Firewall | Missing
    rp_filter_drops: int | None = None       # packets the reverse-path filter dropped, since the
                                             # namespace began (IPReversePathFilter); None: not counted
    disable_ipv6: int | None = None          # net.ipv6.conf.all.disable_ipv6 (1: IPv6 off); None: not said

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> NetworkFacts:
        return cls(text(wire, "hostname"), objects(wire, "interfaces", Interface.from_json),
                   part(wire, "gloo_bind", GlooBind.from_json),
                   part(wire, "route_to_master", Route.from_json, absent="no master address was given"),
                   _port_range(wire), part(wire, "firewall", Firewall.from_json), whole(wire, "rp_filter_drops"),
                   whole(wire, "disable_ipv6"))

    def interface(self, name: str | None) -> Interface | None:
        return next((i for i in self.interfaces if i.name == name), None)

    def interface_with(self, address: str | None) -> Interface | None:
        """The interface that holds this address."""
        return next((i for i in self.interfaces if any(a.address == address for a in i.addresses)), None)
