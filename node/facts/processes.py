"""Who holds the master port, leftover training processes, and whether stacks can be read."""

from __future__ import annotations

import os
import re
import shutil
import time

from .util import cmdline, proc_stat, read, uptime

TRAINING_LAUNCHERS = re.compile(r"(^|/)torchrun$|torch\.distributed\.(run|launch)|torchelastic")
TRAINING_SCRIPT = re.compile(r"train[^/]*\.py$|(^|\.)(base_train|train)$")


def _listening_inodes(port: int) -> dict[int, str]:
    """inode -> local address of TCP sockets listening on `port` (IPv4 and IPv6)."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in (read(table, "") or "").splitlines()[1:]:
            parts = line.split()
            local, state, inode = parts[1], parts[3], int(parts[9])
            address, hexport = local.rsplit(":", 1)
            if state == "0A" and int(hexport, 16) == port:
                found[inode] = address
    return found


def _socket_owners(inodes: set[int]) -> dict[int, int]:
    """inode -> pid, for the processes whose fds we may read."""
    owners = {}
    if not inodes:
        return owners
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{entry}/fd"):
                try:
                    target = os.readlink(f"/proc/{entry}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inode = int(target[8:-1])
                    if inode in inodes:
                        owners[inode] = int(entry)
        except (PermissionError, FileNotFoundError, ProcessLookupError):
            continue
    return owners


def describe(pid: int) -> dict:
    stat = proc_stat(pid) or {}
    argv = cmdline(pid)
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        uid = None
    started = stat.get("start")
    return {"pid": pid, "ppid": stat.get("ppid"), "uid": uid, "cmdline": argv,
            "age_seconds": round(uptime() - started, 1) if started is not None else None,
            "orphan": stat.get("ppid") == 1}


def port_holders(port: int) -> dict:
    inodes = _listening_inodes(port)
    owners = _socket_owners(set(inodes))
    holders = [describe(pid) for pid in sorted(set(owners.values()))]
    unknown = len([i for i in inodes if i not in owners])
    return {"port": port, "listening": bool(inodes), "holders": holders,
            "unattributed": unknown}


def _environ_has_rank(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return False
    keys = {item.split(b"=", 1)[0] for item in env}
    return b"RANK" in keys and b"WORLD_SIZE" in keys


def _same_network(pid: int, own: int | None) -> bool:
    """Whether the process lives in our network namespace: on one machine, containers (and
    lab nodes sharing a kernel) are other machines as far as training goes."""
    if own is None:
        return True
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino == own
    except OSError:
        return True     # another user's process: we cannot tell, so keep it


def own_lineage() -> set[int]:
    """Our own process and its ancestors: never a leftover."""
    mine = set()
    pid = os.getpid()
    while pid and pid not in mine:
        mine.add(pid)
        pid = (proc_stat(pid) or {}).get("ppid", 0)
    return mine


def training_reasons(pid: int, argv: list[str]) -> list[str]:
    """Why a process looks like training: torchrun, a rank (RANK and WORLD_SIZE in its
    environment), or a train*.py script; empty when it does not."""
    joined = " ".join(argv)
    reasons = []
    if any(TRAINING_LAUNCHERS.search(a) for a in argv) or "torch.distributed.run" in joined:
        reasons.append("torchrun")
    if _environ_has_rank(pid):
        reasons.append("RANK in its environment")
    if any(TRAINING_SCRIPT.search(a) for a in argv[1:3]) and "python" in os.path.basename(argv[0]):
        reasons.append("a training script")
    return reasons


def training_processes(master_port: int) -> dict:
    """Processes that look like a training run (training_reasons), or hold the master port.
    Our own process and its ancestors are left out."""
    try:
        own_net = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        own_net = None
    mine = own_lineage()
    found = []
    holders = {h["pid"] for h in port_holders(master_port)["holders"]}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine or not _same_network(int(entry), own_net):
            continue
        pid = int(entry)
        argv = cmdline(pid)
        if not argv:
            continue
        reasons = training_reasons(pid, argv)
        if pid in holders:
            reasons.append(f"holds port {master_port}")
        if reasons:
            found.append({**describe(pid), "why": reasons})
    return {"processes": found, "scanned_at": time.time()}


def ptrace_facts() -> dict:
    scope_text = read("/proc/sys/kernel/yama/ptrace_scope")
    status = read("/proc/self/status", "") or ""
    cap_eff = 0
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            cap_eff = int(line.split()[1], 16)
    return {"ptrace_scope": int(scope_text) if scope_text else None, "euid": os.geteuid(),
            "cap_sys_ptrace": bool(cap_eff & (1 << 19)),
            "py_spy": shutil.which("py-spy") or _beside_python("py-spy")}


def _beside_python(name: str) -> str | None:
    import sys
    candidate = os.path.join(os.path.dirname(sys.executable), name)
    return candidate if os.access(candidate, os.X_OK) else None
