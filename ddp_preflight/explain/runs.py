"""Which of the inputs given together are one run, decided by evidence: inputs that name different
stores (MASTER_ADDR:PORT), different world sizes, or dates days apart are separate runs and each
is explained alone; several files of one run (a node's log and another's, two pastes of one job)
stay one, and share what only one run has where they say it (the store, a rank's pid, a host its
table names). With no evidence either way they are one run, as before. A folder is one run (a
launch's, torchrun's log dir); so is anything given with Flight Recorder dumps, error files or
bundles (they carry no such evidence). Pure, over what messages.py read."""

from __future__ import annotations

import datetime
import ipaddress
import re
from dataclasses import dataclass, field

from ddp_preflight.rules.message_parts import GLOO_PEER

from .inputs import Input, InputKind
from .messages import Messages


@dataclass
class Said:
    """What only one run has, as one given path's logs say it."""
    stores: set[str] = field(default_factory=set)      # "172.18.21.4:37907"; ":29500" where only the port is said
    pids: set[int] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    worlds: set[int] = field(default_factory=set)
    days: set[datetime.date] = field(default_factory=set)
    peers: set[bool] = field(default_factory=set)       # Gloo peers seen: loopback (True), another host (False)

    def same_run(self, other: Said) -> bool:
        return bool(self.stores & other.stores or self.pids & other.pids or self.hosts & other.hosts)

    def other_run(self, other: Said) -> bool:
        apart = bool(self.days and other.days) and \
            min(abs((a - b).days) for a in self.days for b in other.days) > 1
        # Gloo binds one address per rank: a run whose peers are all on loopback (one machine) is
        # not a run whose peers are other hosts' (a loopback rank is unreachable from them).
        apart_hosts = self.peers in ({True}, {False}) and other.peers in ({True}, {False}) and self.peers != other.peers
        return bool(self.stores and other.stores and not self.stores & other.stores
                    or self.worlds and other.worlds and not self.worlds & other.worlds or apart or apart_hosts)


DATE = re.compile(r"(?P<y>20\d\d)-(?P<m>\d\d)-(?P<d>\d\d)")


def _day(text: str | None) -> datetime.date | None:
    found = DATE.match(text or "")
    try:
        return datetime.date(int(found["y"]), int(found["m"]), int(found["d"])) if found else None
    except ValueError:
        return None


NOT_A_HOST = ("localhost", "127.0.0.1", "::1")


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return host == "localhost"


def said_in(m: Messages, paths: set[str]) -> Said:
    out = Said()
    for hit in m.hits:
        if hit.quote.path not in paths:
            continue
        g = hit.found.groups
        stores = {f"{g['host' + n]}:{g['port' + n]}" for n in ("", "2", "3") if g.get("host" + n) and g.get("port" + n)}
        out.stores |= stores
        if not stores and hit.message.id == "store-port-in-use" and g.get("port"):
            out.stores.add(f":{g['port']}")
        if g.get("world"):
            out.worlds.add(int(g["world"]))
        if hit.message.id == "lost-peer":
            peer = GLOO_PEER.search(hit.line.text)
            if peer:
                out.peers.add(_loopback(peer["host"]))
        day = _day(hit.line.time)
        if day is not None:
            out.days.add(day)
    for exit in m.exits:
        if any(q.path in paths for q in exit.quotes):
            if exit.pid is not None:
                out.pids.add(exit.pid)
            if exit.host and exit.host not in NOT_A_HOST:
                out.hosts.add(exit.host)
            day = _day(exit.time)
            if day is not None:
                out.days.add(day)
    return out


def separate(given: list[str], found: list[Input], m: Messages) -> list[list[Input]]:
    """The inputs as runs: one list when they are one run (or cannot be told apart), else one per run."""
    logs = list(dict.fromkeys(given))
    if len(logs) < 2 or any(i.kind not in (InputKind.LOG, InputKind.OTHER) for i in found):
        return [found]
    parts = {g: [i for i in found if _under(i.path, g)] for g in logs}
    said = {g: said_in(m, {("<stdin>" if i.path == "-" else i.path) for i in parts[g]}) for g in logs}
    runs: list[list[str]] = []
    for g in logs:
        fits = [run for run in runs if not any(said[g].other_run(said[o]) for o in run)]
        home = next((run for run in fits if any(said[g].same_run(said[o]) for o in run)), fits[0] if fits else None)
        if home is None:
            runs.append([g])
        else:
            home.append(g)
    if len(runs) == 1:
        return [found]
    return [[i for g in run for i in parts[g]] for run in runs]


def _under(path: str, given: str) -> bool:
    return path == given or path.startswith(given.rstrip("/") + "/")
