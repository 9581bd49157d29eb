"""Where the host list comes from: the command line, a hostfile, or Slurm."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# What ssh accepts as a destination: [user@]host, host an alias, DNS name or address.
HOST = re.compile(r"^(?:[A-Za-z0-9._-]+@)?(?:[A-Za-z0-9][A-Za-z0-9._-]*|\[[0-9A-Fa-f:.]+\]|[0-9A-Fa-f:.]+)$")


class HostListError(Exception):
    pass


def bad_host_reason(host: str) -> str | None:
    if HOST.match(host) and not host.startswith("-"):
        return None
    return (f"host name {host!r} has characters that are not part of a host name; "
            "give an ssh alias, a DNS name or an address")


@dataclass(frozen=True)
class HostfileEntry:
    host: str
    slots: int | None


def read_hostfile(path: str) -> list[HostfileEntry]:
    """DeepSpeed/OpenMPI (`host slots=4`) and MPICH (`host:4`) hostfiles."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise HostListError(f"hostfile {path}: {exc.strerror}") from None
    entries = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        host, slots = parts[0], None
        if ":" in host and host.count(":") == 1:
            host, count = host.split(":")
            slots = _int(count, path, number)
        for part in parts[1:]:
            key, _, value = part.partition("=")
            if key == "slots":
                slots = _int(value, path, number)
        entries.append(HostfileEntry(host, slots))
    if not entries:
        raise HostListError(f"hostfile {path} lists no hosts")
    return entries


def _int(value: str, path: str, number: int) -> int:
    if not value.isdigit():
        raise HostListError(f"hostfile {path} line {number}: slots must be a number, not {value!r}")
    return int(value)


def expand_slurm(nodelist: str) -> list[str]:
    """Slurm's compressed list: 'node[01-03,07],gpu5' -> node01 node02 node03 node07 gpu5."""
    hosts = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", nodelist):
        match = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", item)
        if not match:
            hosts.append(item)
            continue
        prefix, ranges, suffix = match.groups()
        for part in ranges.split(","):
            if "-" in part:
                low, high = part.split("-", 1)
                width = len(low)
                hosts += [f"{prefix}{i:0{width}d}{suffix}" for i in range(int(low), int(high) + 1)]
            else:
                hosts.append(f"{prefix}{part}{suffix}")
    return hosts
