"""The cause of a worker's failed dial to the master when it lies in how the worker resolves the
master's name (issue 38): a stale /etc/hosts line, or DNS, maps it to an address that is none of
the master's. Named on the worker, with what the name resolves to there, where from, and the one
command that changes it; never a firewall."""

from __future__ import annotations

import ipaddress
import shlex
from dataclasses import dataclass, field
from typing import Any

from ddp_preflight.rules.facts import Missing
from ddp_preflight.rules.fix import Fix, run

from ..model import NodeFacts
from ..probes.network_seen import Dial, MasterListener


@dataclass(frozen=True)
class NameCause:
    why: str                     # in words, on the worker
    fix: Fix
    details: dict[str, Any] = field(default_factory=dict, compare=False)


def _literal(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


def _addresses(node: NodeFacts) -> set[str] | None:
    """Every address on the node's interfaces; None where its facts do not say."""
    network = node.parsed.network
    if isinstance(network, Missing):
        return None
    return {a.address for i in network.interfaces for a in i.addresses}


def name_cause(master: NodeFacts, listener: MasterListener, dial: Dial) -> NameCause | None:
    """Why the worker's dial to the master's name got nowhere, if its resolution says it: the name
    resolved there to an address that none of the master's interfaces has."""
    name, resolved, ip = dial.sent.get("address"), dial.sent.get("resolved"), listener.ip
    if not isinstance(name, str) or not isinstance(resolved, str) or not ip or _literal(name) or resolved == ip:
        return None
    own = _addresses(master)
    if own is None or resolved in own:
        return None      # another of the master's own addresses: not a stale name
    line = dial.sent.get("hosts_line")
    src = dial.src
    if isinstance(line, dict) and isinstance(line.get("line"), int):
        number, text = line["line"], str(line.get("text", ""))
        where = f"/etc/hosts line {number}: `{text}`"
        # In place (a container's /etc/hosts is a mount, where `sed -i` cannot rename a copy over it).
        script = f'h=$(sed "{number}s/^[^[:space:]]*/{ip}/" /etc/hosts) && printf "%s\\n" "$h" > /etc/hosts'
        fix = run(f"on {src}: sudo sh -c {shlex.quote(script)}", src,
                  f"line {number} of {src}'s /etc/hosts then maps {name} to {ip}, the master's address")
    else:
        number, where = None, "not from /etc/hosts: DNS, or another source /etc/nsswitch.conf names"
        fix = run(f"on {src}: echo {shlex.quote(f'{ip} {name}')} | sudo tee -a /etc/hosts", src,
                  f"/etc/hosts is read before DNS (hosts: files dns); or correct the DNS record of {name}")
    why = (f"the name {name} resolves on {src} to {resolved} ({where}), which is none of the master's addresses "
           f"(it listens at {ip})")
    return NameCause(why, fix, {"name": name, "resolved": resolved, "master_ip": ip, "hosts_line": number})
