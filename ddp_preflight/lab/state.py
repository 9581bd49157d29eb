"""What a lab is made of, saved as JSON so that `down` removes exactly what `up` created."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import LabError

DEFAULT_LAB_NAME = "lab"
# Interface names are at most 15 bytes; the lab name goes into them, so it stays short.
LAB_NAME_PATTERN = re.compile(r"^[a-z][a-z0-9]{0,7}$")


def lab_root() -> Path:
    return Path(os.environ.get("DDP_PREFLIGHT_LAB_ROOT", "/run/ddp-preflight"))


def check_lab_name(name: str) -> str:
    if not LAB_NAME_PATTERN.match(name):
        raise LabError(f"lab name {name!r} is not usable: use 1-8 lowercase letters or digits, "
                       "starting with a letter (e.g. --name lab2)")
    return name


@dataclass
class Node:
    name: str
    netns: str
    ipv4: str
    ipv6: str
    switch_port: str          # the node's veth end on the lab's switch
    iface: str = "eth0"       # the node's LAN interface (the wifi fault renames it)
    sshd_pid: int = 0
    sshd_start: int = 0       # start time in clock ticks: PID + start time name one process


@dataclass
class Fault:
    kind: str
    node: str
    param: str | None = None
    undo: list[dict] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.kind}@{self.node}" + (f":{self.param}" if self.param else "")


@dataclass
class LabState:
    name: str
    directory: str
    subnet4: str
    subnet6: str
    host_iface: str
    host_ipv4: str
    host_ipv6: str
    switch_netns: str
    shard_count: int
    nodes: list[Node] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    undo: list[dict] = field(default_factory=list)   # what up created, in order
    ready: bool = False
    slurm: dict = field(default_factory=dict)        # `up --slurm`: lab/slurm.py's settings

    # Paths inside the lab's directory.
    @property
    def path(self) -> Path:
        return Path(self.directory)

    @property
    def state_file(self) -> Path:
        return self.path / "state.json"

    @property
    def ssh_config(self) -> Path:
        return self.path / "ssh_config"

    @property
    def ssh_dir(self) -> Path:
        return self.path / "ssh"

    @property
    def data_dir(self) -> Path:
        """The data folder's path, the same on every node (each node mounts its own there)."""
        return self.path / "data"

    def node_dir(self, node: str) -> Path:
        return self.path / "nodes" / node

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        known = ", ".join(n.name for n in self.nodes)
        raise LabError(f"lab {self.name!r} has no node {name!r} (nodes: {known})")

    def save(self) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(self.state_file)

    @classmethod
    def load(cls, name: str) -> LabState | None:
        path = lab_root() / name / "state.json"
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise LabError(f"cannot read lab state {path}: {exc}; remove the lab with "
                           f"'ddp-preflight lab down --name {name}'") from None
        raw["nodes"] = [Node(**n) for n in raw.get("nodes", [])]
        raw["faults"] = [Fault(**f) for f in raw.get("faults", [])]
        return cls(**raw)


def all_labs() -> list[LabState]:
    root = lab_root()
    if not root.is_dir():
        return []
    labs = []
    for entry in sorted(root.iterdir()):
        if LAB_NAME_PATTERN.match(entry.name):
            state = LabState.load(entry.name)
            if state is not None:
                labs.append(state)
    return labs


@contextlib.contextmanager
def locked():
    """Serialise lab changes across processes: `up` twice at once must not build twice.

    Creates the labs' root folder; the last `down` removes it again."""
    root = lab_root()
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
