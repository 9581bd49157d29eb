"""What may be given as a host: the one check every host passes, whatever its source (the command
line, a hostfile, the config, Slurm's lists, a Slurm job's nodes, `hangwatch attach`), before
anything is done with it.

A host name reaches a shell more often than it seems: paramiko puts it into an ssh config's
`Match exec` and `ProxyCommand` (`%h`), which run through a shell as the tool's user (often
root); ssh and srun read a leading `-` as an option; a `%` in it is expanded again as a token.
So only what an ssh alias, a DNS name, an address or `user@` can hold passes: letters, digits,
`.`, `_` and `-` (not first), an IPv6 address bare or in brackets; nothing else (no `$`,
backquote, `;`, `|`, space, `%`, quote, newline or other control character), at most
MAX_NAME characters. And no list of hosts holds more than MAX_HOSTS: a list is refused before
anything is done with its hosts."""

from __future__ import annotations

import re
from collections.abc import Sequence

# More nodes than this tool is made for; a longer list is refused in one line, before its hosts
# are looked at, so a 100,000-line hostfile costs a read, not minutes and gigabytes.
MAX_HOSTS = 4096
# A DNS name has at most 253 characters; with `user@` in front, 255 is already more than any
# real destination.
MAX_NAME = 255

_NAME = r"[A-Za-z0-9._-]+"
_DESTINATION = re.compile(rf"(?:{_NAME}@)?(?:{_NAME}|\[[0-9A-Fa-f:.]+\]|[0-9A-Fa-f:.]+)")
_WITH_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([0-9]+)")
_ALLOWED = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-@[]:")
_FIX = "give an ssh alias, a DNS name or an address"


class HostListError(Exception):
    """A host or a list of hosts that is refused: one line naming the host and where it came
    from."""


def shown_host(host: str) -> str:
    """The host as a message quotes it: control characters escaped (never obeyed by a
    terminal), a long one cut."""
    if len(host) <= 80:
        return repr(host)
    return f"{host[:60]!r}... ({len(host)} characters)"


def bad_host_reason(host: str) -> str | None:
    """Why `host` must not be used as a host (a one-line reason that quotes it), or None."""
    if not host:
        return f"host name {shown_host(host)} is empty; {_FIX}"
    if len(host) > MAX_NAME:
        return f"host name {shown_host(host)} is longer than the {MAX_NAME} characters a host name may have; {_FIX}"
    if host.startswith("-"):
        return f"host name {shown_host(host)} starts with '-', which ssh and srun would read as an option; {_FIX}"
    odd = "".join(dict.fromkeys(c for c in host if c not in _ALLOWED))
    if odd:
        listed = ", ".join(repr(c) for c in odd)
        return f"host name {shown_host(host)} has characters that are not part of a host name ({listed}); {_FIX}"
    name = host.rsplit("@", 1)[-1]
    with_port = _WITH_PORT.fullmatch(name)     # scp's and URLs' NAME:PORT, [ADDRESS]:PORT (one colon: never IPv6)
    if with_port:
        bare = with_port.group(1).strip("[]")
        return (f"host name {shown_host(host)} names a port: ssh takes it from the ssh config (Host {bare} / "
                f"Port {with_port.group(2)}, as ssh -p does); give {host[:-len(with_port.group(2)) - 1]}")
    if not _DESTINATION.fullmatch(host) or name.startswith("-"):
        return f"host name {shown_host(host)} is not a host name, an address or user@host; {_FIX}"
    return None


def check_hosts(origin: str, hosts: Sequence[str]) -> None:
    """Every host of one source (`origin`: where it came from, as the message says it), and
    their number: raises HostListError with one line naming the first refused host."""
    if len(hosts) > MAX_HOSTS:
        raise HostListError(f"{origin} lists {len(hosts)} hosts, more than the {MAX_HOSTS} ddp-preflight takes; "
                            "give the hosts of one run")
    for host in hosts:
        reason = bad_host_reason(host)
        if reason:
            raise HostListError(f"{origin}: {reason}")
