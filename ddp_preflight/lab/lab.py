"""Bring a lab up, change its faults, run commands in its nodes, and take it down exactly."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from . import addressing, hosts, shards, slurm, sshd
from .errors import LabError
from .faults import FAULTS, FaultSpec, _rename_commands
from .nodeexec import in_node
from .state import DEFAULT_LAB_NAME, Fault, LabState, Node, all_labs, check_lab_name, lab_root, locked
from .system import ip_batch, is_same_process, netns_inode, pids_in_netns, run, terminate

REQUIRED = {
    # command: the Debian package that brings it
    "ip": "iproute2", "tc": "iproute2", "nft": "nftables", "unshare": "util-linux",
    "ssh-keygen": "openssh-client", "ssh": "openssh-client", sshd.SSHD: "openssh-server",
}


def check_requirements() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, veth links, sshd on port 22): "
                       "run it with sudo")
    missing = sorted({pkg for cmd, pkg in REQUIRED.items() if shutil.which(cmd) is None})
    if missing:
        raise LabError(f"the lab needs {', '.join(missing)}: apt-get install {' '.join(missing)}")
    probe = run(["ip", "netns", "list"], check=False)
    if probe.returncode != 0:
        raise LabError(f"'ip netns' does not work here ({probe.stderr.strip()}): the lab needs "
                       "network namespaces (a kernel with CONFIG_NET_NS and CAP_SYS_ADMIN)")


def node_names(count: int) -> list[str]:
    if not 1 <= count <= addressing.MAX_NODES:
        raise LabError(f"--nodes {count}: the lab has 1 to {addressing.MAX_NODES} nodes")
    return ["master"] + [f"worker{i}" for i in range(1, count)]


@dataclass
class DownReport:
    name: str
    stopped: list[int] = field(default_factory=list)     # processes that ran in the nodes
    problems: list[str] = field(default_factory=list)    # what could not be removed, and why


class Lab:
    def __init__(self, state: LabState):
        self.state = state

    # -- finding ------------------------------------------------------------------------
    @classmethod
    def open(cls, name: str = DEFAULT_LAB_NAME) -> Lab:
        state = LabState.load(check_lab_name(name))
        if state is None or not state.ready:
            raise LabError(f"no lab named {name!r} is up: run 'ddp-preflight lab up"
                           + (f" --name {name}" if name != DEFAULT_LAB_NAME else "") + "'")
        return cls(state)

    @property
    def nodes(self) -> list[Node]:
        return self.state.nodes

    def node(self, name: str) -> Node:
        return self.state.node(name)

    @property
    def ssh_config(self) -> Path:
        return self.state.ssh_config

    # -- up -----------------------------------------------------------------------------
    @classmethod
    def up(cls, name: str = DEFAULT_LAB_NAME, nodes: int = 2, faults: Sequence[str] = (),
           subnet: str | None = None, shard_count: int = 8,
           with_slurm: bool = False) -> tuple[Lab, bool]:
        """Build the lab; returns it and whether it was built now (False: already up).
        with_slurm: a real Slurm across its nodes (lab/slurm.py)."""
        check_lab_name(name)
        names = node_names(nodes)
        specs = [FaultSpec.parse(f) for f in faults]
        for spec in specs:
            if spec.node not in names:
                raise LabError(f"fault {spec.kind}@{spec.node}: no such node (nodes: "
                               f"{', '.join(names)})")
        check_requirements()
        if with_slurm:
            slurm.check_requirements()
        with locked():
            existing = LabState.load(name)
            if existing is not None and existing.ready:
                wanted = {(s.kind, s.node) for s in specs}
                have = {(f.kind, f.node) for f in existing.faults}
                if with_slurm and not existing.slurm:
                    raise LabError(f"lab {name!r} is already up without Slurm: 'lab down"
                                   + (f" --name {name}" if name != DEFAULT_LAB_NAME else "")
                                   + "' first, then 'lab up --slurm'")
                if len(existing.nodes) == nodes and wanted <= have:
                    return cls(existing), False
                raise LabError(f"lab {name!r} is already up with {len(existing.nodes)} nodes and "
                               f"faults [{', '.join(f.label for f in existing.faults)}]: change faults "
                               "with 'lab fault add|clear', or 'lab down' first")
            if existing is not None:       # a build that died half-way: finish removing it
                _teardown(existing)
            others = [(lab.subnet4, lab.subnet6) for lab in all_labs() if lab.name != name]
            plan = addressing.choose(others, subnet)
            state = _new_state(name, names, plan, shard_count)
            try:
                _build(state, plan)
                if with_slurm:
                    slurm.build(state, lambda *records: _record(state, *records))
                lab = cls(state)
                for spec in specs:
                    lab._apply(spec)
                state.ready = True
                state.save()
            except BaseException:
                _teardown(state)
                raise
            return lab, True

    # -- faults ---------------------------------------------------------------------------
    def add_fault(self, text: str) -> None:
        spec = FaultSpec.parse(text)
        self.node(spec.node)
        with locked():
            self._apply(spec)
            self.state.save()

    def _apply(self, spec: FaultSpec) -> None:
        if any(f.kind == spec.kind and f.node == spec.node for f in self.state.faults):
            return   # already there: adding twice is a no-op
        node = self.node(spec.node)
        kind = FAULTS[spec.kind]
        fault = Fault(spec.kind, spec.node, spec.param or kind.default_param)
        self.state.faults.append(fault)
        try:
            fault.undo = kind.apply(self.state, node, spec.param)
            for record in fault.undo:
                if record["kind"] == "hosts":
                    hosts.write_node_etc(self.state, node)
        except BaseException:
            self.state.faults.remove(fault)
            raise
        finally:
            self.state.save()

    def clear_faults(self, texts: list[str] | None = None) -> list[str]:
        """Remove the named faults (FAULT@NODE), or all; returns the labels removed."""
        wanted = None
        if texts:
            wanted = {(s.kind, s.node) for s in map(FaultSpec.parse, texts)}
        removed = []
        with locked():
            for fault in list(reversed(self.state.faults)):
                if wanted is None or (fault.kind, fault.node) in wanted:
                    self.state.faults.remove(fault)
                    problems: list[str] = []
                    for record in reversed(fault.undo):
                        _undo(self.state, record, problems)
                    if problems:
                        raise LabError(f"clearing {fault.label}: {problems[0]}")
                    removed.append(fault.label)
                    self.state.save()
        return removed

    # -- running things in nodes ------------------------------------------------------------
    def command(self, node: str, argv: list[str]) -> list[str]:
        return in_node(self.state, self.node(node), argv)

    def exec(self, node: str, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.command(node, argv), **kwargs)

    def popen(self, node: str, argv: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(node, argv), **kwargs)

    def processes(self, node: str) -> list[int]:
        inode = netns_inode(self.node(node).netns)
        return pids_in_netns(inode) if inode else []

    # -- status and down --------------------------------------------------------------------
    def status(self) -> dict:
        s = self.state
        return {
            "name": s.name, "subnet4": s.subnet4, "subnet6": s.subnet6,
            "operator": {"iface": s.host_iface, "ipv4": s.host_ipv4, "ipv6": s.host_ipv6},
            "ssh_config": str(s.ssh_config), "data_dir": str(s.data_dir),
            "slurm": ({**s.slurm, "env": slurm.environment(s)} if s.slurm else None),
            "nodes": [{"name": n.name, "netns": n.netns, "iface": n.iface, "ipv4": n.ipv4,
                       "ipv6": n.ipv6, "sshd": is_same_process(n.sshd_pid, n.sshd_start),
                       "faults": [f.label for f in s.faults if f.node == n.name]}
                      for n in s.nodes],
        }

    @staticmethod
    def down(name: str = DEFAULT_LAB_NAME) -> DownReport | None:
        """Remove everything the lab created; None when no such lab was up."""
        check_lab_name(name)
        check_requirements()
        if LabState.load(name) is None:
            return None        # nothing to lock or remove (and no folder to create)
        with locked():
            state = LabState.load(name)
            if state is None:
                return None
            return _teardown(state)


# -- building -----------------------------------------------------------------------------

def _new_state(name: str, names: list[str], plan: addressing.Plan, shard_count: int) -> LabState:
    directory = lab_root() / name
    state = LabState(
        name=name, directory=str(directory), subnet4=str(plan.subnet4),
        subnet6=str(plan.subnet6), host_iface=f"dpl-{name}", host_ipv4=plan.operator_ipv4,
        host_ipv6=plan.operator_ipv6, switch_netns=f"ddpl-{name}-switch",
        shard_count=shard_count,
        nodes=[Node(name=n, netns=f"ddpl-{name}-{n}", ipv4=plan.node_ipv4(i),
                    ipv6=plan.node_ipv6(i), switch_port=f"p-{n}") for i, n in enumerate(names)])
    for netns in [state.switch_netns] + [n.netns for n in state.nodes]:
        if netns_inode(netns) is not None:
            raise LabError(f"network namespace {netns} already exists but no lab state owns it: "
                           f"remove it with 'ip netns del {netns}' or use another --name")
    if Path(f"/sys/class/net/{state.host_iface}").exists():
        raise LabError(f"interface {state.host_iface} already exists: remove it with "
                       f"'ip link del {state.host_iface}' or use another --name")
    directory.mkdir(parents=True, exist_ok=False)
    state.undo.append({"kind": "path", "path": str(directory)})
    state.save()
    return state


def _record(state: LabState, *records: dict) -> None:
    """Write down what is about to be created before creating it, so a crash leaves a trail."""
    state.undo.extend(records)
    state.save()


def _build(state: LabState, plan: addressing.Plan) -> None:
    sw = state.switch_netns
    # Namespaces, links and the operator's address: one `ip` process for all of it.
    _record(state, {"kind": "netns", "name": sw},
            *({"kind": "netns", "name": n.netns} for n in state.nodes),
            {"kind": "link", "netns": None, "name": state.host_iface})
    commands = [f"netns add {sw}"] + [f"netns add {n.netns}" for n in state.nodes]
    commands.append(f"link add {state.host_iface} type veth peer name uplink netns {sw}")
    commands += [f"link add eth0 netns {n.netns} type veth peer name {n.switch_port} netns {sw}"
                 for n in state.nodes]
    commands += [f"addr add {state.host_ipv4}/{plan.subnet4.prefixlen} dev {state.host_iface}",
                 f"addr add {state.host_ipv6}/64 dev {state.host_iface} nodad",
                 f"link set {state.host_iface} up"]
    ip_batch(commands)
    ip_batch(["link add br0 type bridge", "link set br0 up", "link set uplink master br0",
              "link set uplink up"]
             + [f"link set {n.switch_port} master br0 up" for n in state.nodes], netns=sw)

    def configure(node: Node) -> None:
        # A node's IPv6 address survives its link going down and up (a dead-link test, a renamed
        # interface), as its IPv4 one does: Linux drops it otherwise (keep_addr_on_down=0).
        run(["ip", "netns", "exec", node.netns, "sysctl", "-q", "-w", "net.ipv6.conf.all.keep_addr_on_down=1",
             "net.ipv6.conf.default.keep_addr_on_down=1", "net.ipv6.conf.eth0.keep_addr_on_down=1"])
        ip_batch(["link set lo up", f"addr add {node.ipv4}/{plan.subnet4.prefixlen} dev eth0",
                  f"addr add {node.ipv6}/64 dev eth0 nodad", "link set eth0 up"],
                 netns=node.netns)

    for parent in (hosts.ETC_NETNS, sshd.PRIVSEP_DIR):
        if not parent.exists():
            _record(state, {"kind": "dir_if_empty", "path": str(parent)})
            parent.mkdir(mode=0o755)
    _record(state, *({"kind": "path", "path": str(hosts.ETC_NETNS / n.netns)} for n in state.nodes))

    state.data_dir.mkdir()
    shards.make_dataset(state.path / "dataset", state.shard_count)
    sshd.client_key(state)

    def prepare(node: Node) -> None:
        configure(node)
        hosts.write_node_etc(state, node)
        state.node_dir(node.name).mkdir(parents=True)
        shards.copy_dataset(state.path / "dataset", state.node_dir(node.name) / "data")
        sshd.write_sshd_config(state, node)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(prepare, state.nodes))
    for node in state.nodes:
        sshd.start(state, node)
        _record(state, {"kind": "process", "pid": node.sshd_pid, "start": node.sshd_start})
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda n: sshd.wait_ready(state, n), state.nodes))
    sshd.write_client_files(state)


# -- removing -----------------------------------------------------------------------------

def _teardown(state: LabState) -> DownReport:
    report = DownReport(state.name)
    # Power off the machines first: every process that lives in a node's network namespace,
    # ours (sshd, leftovers) and whatever was started there through ssh or `lab exec`.
    for netns in [n.netns for n in state.nodes] + [state.switch_netns]:
        inode = netns_inode(netns)
        if inode is not None:
            pids = [p for p in pids_in_netns(inode) if p != os.getpid()]
            terminate(pids)
            report.stopped.extend(pids)
    for fault in reversed(state.faults):
        for record in reversed(fault.undo):
            if record["kind"] not in ("hosts", "shards", "rename", "qdisc", "link_mtu", "sysctl", "ipv6_address"):
                _undo(state, record, report.problems)   # the rest goes with the namespaces
    for record in reversed(state.undo):
        _undo(state, record, report.problems)
    root = lab_root()
    try:
        root.rmdir()      # only when no other lab is left in it
    except OSError:
        pass
    return report


def _undo(state: LabState, record: dict, problems: list[str]) -> None:
    kind = record["kind"]
    try:
        if kind == "netns":
            if netns_inode(record["name"]) is not None:
                run(["ip", "netns", "del", record["name"]])
        elif kind == "link":
            ns = record.get("netns")
            if ns is None and Path(f"/sys/class/net/{record['name']}").exists():
                run(["ip", "link", "del", record["name"]])
            elif ns is not None and netns_inode(ns) is not None:
                run(["ip", "-n", ns, "link", "del", record["name"]], check=False)
        elif kind == "path":
            path = Path(record["path"])
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
        elif kind == "dir_if_empty":
            # A system folder the labs share (/run/sshd: every lab's sshd needs it at each new
            # connection). While another lab is up it stays, and that lab inherits removing it.
            others = [lab for lab in all_labs() if lab.name != state.name]
            if others:
                others[0].undo.insert(0, record)
                others[0].save()
                return
            try:
                Path(record["path"]).rmdir()
            except (FileNotFoundError, OSError):
                pass   # the system (or something else) still uses it
        elif kind == "process":
            if is_same_process(record["pid"], record["start"]):
                terminate([record["pid"]])
        elif kind == "nft_table":
            if netns_inode(record["netns"]) is not None:
                run(["ip", "netns", "exec", record["netns"], "nft", "delete", "table",
                     record["family"], record["table"]], check=False)
        elif kind == "qdisc":
            run(["tc", "-n", record["netns"], "qdisc", "del", "dev", record["dev"], "root"],
                check=False)
        elif kind == "link_mtu":
            ip_batch([f"link set dev {record['dev']} mtu {record['mtu']} gso_max_segs {record['gso_max_segs']}"],
                     netns=record["netns"])
        elif kind == "sysctl":
            if netns_inode(record["netns"]) is not None:
                run(["ip", "netns", "exec", record["netns"], "sysctl", "-q", "-w", f"{record['key']}={record['value']}"])
        elif kind == "ipv6_address":
            if netns_inode(record["netns"]) is not None:
                ip_batch([f"addr replace {record['address']} dev {record['dev']} nodad"], netns=record["netns"])
        elif kind == "rename":
            node = state.node(record["node"])
            ip_batch(_rename_commands(record["from"], record["to"], node), netns=node.netns)
            node.iface = record["to"]
        elif kind == "hosts":
            hosts.write_node_etc(state, state.node(record["node"]))
        elif kind == "shards":
            shards.copy_dataset(state.path / "dataset", state.node_dir(record["node"]) / "data")
        else:
            problems.append(f"unknown undo record {kind!r}")
    except (LabError, OSError) as exc:
        problems.append(f"{kind} {record}: {exc}")

