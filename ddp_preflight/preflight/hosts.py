"""Where the host list comes from: the command line, a hostfile, the config or Slurm. Every host
of every source passes the one check of transport/host_names.py (also used by hangwatch and the
transport itself) before anything is done with it; every list is capped at MAX_HOSTS, and a
hostfile is read only when it is a regular file of at most MAX_HOSTFILE_BYTES, in bounded time
and memory."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ddp_preflight.node.bounded import Skipped, read_regular, size_text
from ddp_preflight.transport.host_names import MAX_HOSTS, HostListError, bad_host_reason, check_hosts
from ddp_preflight.transport.slurm_job import hostnames

__all__ = ["MAX_HOSTS", "MAX_HOSTFILE_BYTES", "HostListError", "HostfileEntry", "bad_host_reason", "check_hosts",
           "check_unique", "hostfile_slots", "node_paths", "NodePaths", "read_hostfile", "slurm_hosts"]

# A hostfile of MAX_HOSTS long lines (`host-name.domain slots=8  # rack 12`) fits in far less:
# a bigger file is not a hostfile of one run, and is refused before it is read.
MAX_HOSTFILE_BYTES = 1 << 20


# --- hostfiles -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class HostfileEntry:
    host: str
    slots: int | None
    line: int = field(default=0, compare=False)     # where it is in the file, for messages


def read_hostfile(path: str) -> list[HostfileEntry]:
    """DeepSpeed/OpenMPI (`host slots=4`) and MPICH (`host:4`) hostfiles."""
    text = _text_of(_read_bounded(path), path)
    entries: list[HostfileEntry] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if len(entries) == MAX_HOSTS:
            raise HostListError(f"hostfile {path} lists more than the {MAX_HOSTS} hosts ddp-preflight takes "
                                f"(line {number} is host {MAX_HOSTS + 1}); give the hosts of one run")
        parts = line.split()
        host, slots = parts[0], None
        if ":" in host and host.count(":") == 1:
            host, count = host.split(":")
            slots = _slots(count, path, number)
        for part in parts[1:]:
            key, _, value = part.partition("=")
            if key == "slots":
                slots = _slots(value, path, number)
        check_hosts(f"hostfile {path} line {number}", [host])
        entries.append(HostfileEntry(host, slots, number))
    if not entries:
        raise HostListError(f"hostfile {path} lists no hosts")
    return entries


def _read_bounded(path: str) -> bytes:
    """The hostfile's bytes, when it is a regular file of at most MAX_HOSTFILE_BYTES: read as
    every file another user may have placed is (node/bounded.py), so a FIFO put in its place is
    refused at once instead of waiting forever for a writer, and a huge file is never read."""
    try:
        return read_regular(path, MAX_HOSTFILE_BYTES)
    except Skipped as exc:
        raise HostListError(f"hostfile {path} is not read: {exc}; give a regular file of one 'host slots=N' per "
                            f"line, at most {MAX_HOSTS} hosts and {size_text(MAX_HOSTFILE_BYTES)}") from None
    except OSError as exc:
        raise HostListError(f"hostfile {path}: {exc.strerror}") from None


def _text_of(data: bytes, path: str) -> str:
    """The file as text; a binary file (a NUL byte, or bytes that are not UTF-8) is refused."""
    at = data.find(b"\0")
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        at = exc.start if at < 0 else min(at, exc.start)
    if at >= 0:
        raise HostListError(f"hostfile {path} is not a text file (byte {at} is not text); "
                            "give a file with one 'host slots=N' per line")
    return text


def _slots(value: str, path: str, number: int) -> int:
    if not value.isdigit() or int(value) < 1:
        raise HostListError(f"hostfile {path} line {number}: slots must be a number of 1 or more, "
                            f"not {value!r}")
    return int(value)


def hostfile_slots(entries: list[HostfileEntry], path: str) -> tuple[int | None, dict[str, int]]:
    """The processes per node the hostfile asks for: (its hosts' one slot count, {}) where they
    agree, (None, {}) where none gives one, and (the most, each host's own) where they differ, as
    DeepSpeed allows (`host1 slots=4`, `host2 slots=2`): torchrun on each node then starts its
    own, and the ranks are numbered node after node. Slots on some hosts only is an error: the
    others' count would be a guess."""
    given = {e.slots for e in entries}
    if given == {None}:
        return None, {}
    if None in given:
        bare = ", ".join(f"{e.host} (line {e.line})" for e in entries if e.slots is None)
        raise HostListError(f"hostfile {path} gives slots for some hosts but not for {bare}: give every host "
                            "its slots=N, or pass --nproc-per-node N")
    if len(given) == 1:
        return given.pop(), {}
    counts = {e.host: e.slots for e in entries if e.slots is not None}
    return max(counts.values()), counts


# --- one machine, one entry ------------------------------------------------------------------------

def _machine(host: str) -> str:
    """The machine an ssh destination names: `root@Node1` and `node1` are the same one."""
    return host.rsplit("@", 1)[-1].strip("[]").lower()


def check_unique(sources: list[tuple[str, list[str]]]) -> None:
    """Each machine once across all the host lists, given as (where from, hosts): a second
    entry would start a second node rank on the same machine."""
    seen: dict[str, str] = {}
    for origin, hosts in sources:
        for host in hosts:
            first = seen.get(_machine(host))
            if first is not None:
                where = f"twice in {origin}" if first == origin else f"in {first} and in {origin}"
                raise HostListError(f"{host} is listed {where}: two entries for one machine would start "
                                    "two node ranks there; list each machine once "
                                    "(--nproc-per-node sets the ranks per machine)")
            seen[_machine(host)] = origin


# --- Slurm ---------------------------------------------------------------------------------------

SLURM_VARIABLES = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")


def slurm_hosts(environ: Mapping[str, str]) -> tuple[str, list[str]]:
    """The allocation's hosts from the environment: (the variable read, its hosts), expanded as
    Slurm expands them (transport/slurm_job.hostnames: the one expansion of a Slurm host list)."""
    variable = next((v for v in SLURM_VARIABLES if v in environ), None)
    if variable is None:
        raise HostListError("--slurm: SLURM_JOB_NODELIST is not set (run inside an allocation: salloc/sbatch)")
    value = environ[variable]
    try:
        return variable, hostnames(value)
    except HostListError as exc:
        raise HostListError(f"--slurm: {variable}={value!r}: {exc}") from None


# --- a folder per node: --data-dir NODE:PATH, --code-dir NODE:PATH -----------------------------

@dataclass(frozen=True)
class NodePaths:
    """A folder option as given: one for every node, and each node's own (which wins there)."""
    every: str | None = None
    nodes: Mapping[str, str] = field(default_factory=dict)

    def of(self, node: str) -> str | None:
        return self.nodes.get(node) or self.every


def node_paths(option: str, values: list[str], hosts: list[str], what: str = "folder") -> NodePaths:
    """`--data-dir PATH` (every node) and `--data-dir NODE:PATH` (that node; repeatable), as
    `[nodes.NAME] data_dir` in the config. NODE: is a host of this run (an IPv6 address too);
    a word before ':' that names none is refused, so a typo never becomes a folder's name."""
    every: str | None = None
    nodes: dict[str, str] = {}
    for value in values:
        host = next((h for h in sorted(hosts, key=len, reverse=True) if value.startswith(h + ":")), None)
        if host is not None:
            path = value[len(host) + 1:]
            if not path:
                raise HostListError(f"{option} {value}: no {what} after '{host}:': write {option} {host}:PATH")
            if host in nodes and nodes[host] != path:
                raise HostListError(f"{option} names two {what}s for {host} ({nodes[host]}, {path}): give one")
            nodes[host] = path
            continue
        word, colon, _ = value.partition(":")
        if colon and word and "/" not in word and not word.startswith(("~", ".")):
            raise HostListError(f"{option} {value}: {word} is not one of the hosts ({', '.join(hosts) or 'none given'}):"
                                f" write {option} NODE:PATH with a host of this run, or {option} PATH for every node")
        if every is not None and every != value:
            raise HostListError(f"{option} names two {what}s for every node ({every}, {value}): give one, "
                                f"and {option} NODE:PATH for a node whose {what} differs")
        every = value
    return NodePaths(every, nodes)
