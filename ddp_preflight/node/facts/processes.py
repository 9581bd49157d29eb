"""Who holds the master port, leftover training processes, and whether stacks can be read."""

from __future__ import annotations

import os
import re
import time

from .. import proc, pyspy, ranks
from ..boot import STAGE0
from ..proc import read
from ..trust import user_name

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
    owners: dict = {}
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
    st = proc.stat(pid)
    uid = proc.owner(pid)
    return {"pid": pid, "ppid": st.ppid if st else None, "uid": uid, "user": None if uid is None else user_name(uid),
            "cmdline": proc.cmdline(pid),
            "age_seconds": round(proc.uptime() - st.start_seconds, 1) if st else None,
            "orphan": st is not None and st.ppid == 1}


def port_holders(port: int) -> dict:
    inodes = _listening_inodes(port)
    owners = _socket_owners(set(inodes))
    holders = [describe(pid) for pid in sorted(set(owners.values()))]
    unknown = len([i for i in inodes if i not in owners])
    return {"port": port, "listening": bool(inodes), "holders": holders,
            "unattributed": unknown}


def _same_network(pid: int, own: int | None) -> bool:
    """Whether the process lives in our network namespace: on one machine, containers (and
    lab nodes sharing a kernel) are other machines as far as training goes."""
    if own is None:
        return True
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino == own
    except OSError:
        return True     # another user's process: we cannot tell, so keep it


JOB_MODULE = "ddp_preflight.node.jobs."
ANCESTORS = 8             # how far up a process's parents are looked at for a node program


def preflight_job(pid: int, argv: list[str], mine: set[int]) -> dict:
    """Whether the process is a rank of another ddp-preflight's probe job, running now: its own
    command is one of the jobs' modules (node/torchjob.py starts each rank so), and a live
    ddp-preflight node program (its boot line, node/boot.py) is among its parents, not this one's.
    {"job": the job, "node_program": that program's pid}, or {} for any other process (an
    orphaned probe rank, whose program is gone, is a leftover like any other)."""
    job = next((a[len(JOB_MODULE):] for a in argv[1:4] if a.startswith(JOB_MODULE)), None)
    if job is None:
        return {}
    parent = pid
    for _ in range(ANCESTORS):
        st = proc.stat(parent)
        parent = st.ppid if st else 0
        if parent <= 1 or parent in mine:
            return {}
        if STAGE0 in (proc.cmdline(parent) or []):
            return {"job": job, "node_program": parent}
    return {}


def own_lineage() -> set[int]:
    """Our own process and its ancestors: never a leftover."""
    mine = set()
    pid = os.getpid()
    while pid and pid not in mine:
        mine.add(pid)
        st = proc.stat(pid)
        pid = st.ppid if st else 0
    return mine


def training_reasons(pid: int, argv: list[str]) -> list[str]:
    """Why a process looks like training: torchrun, a rank (node/ranks.py's rule), or a
    train*.py script; empty when it does not."""
    reasons = []
    if ranks.is_launcher(argv):
        reasons.append("torchrun")
    if ranks.has_rank(proc.environ(pid)):
        reasons.append("RANK in its environment")
    if any(TRAINING_SCRIPT.search(a) for a in argv[1:3]) and "python" in os.path.basename(argv[0]):
        reasons.append("a training script")
    return reasons


def loads_torch(pid: int) -> bool:
    """Whether torch's own library is mapped into the process: it imported torch. Readable for
    this user's processes (and every one, as root); False where it is not."""
    maps = read(f"/proc/{pid}/maps", "") or ""
    return "/libtorch" in maps


def evidence(pid: int, argv: list[str], launchers: set[int], holders: set[int], master_port: int) -> list[str]:
    """What shows a process is part of a training run, beyond what anyone can claim (RANK in an
    environment, a script named train.py): it is torchrun, torchrun started it, it holds the
    master port, or it has torch loaded."""
    found = []
    if ranks.is_launcher(argv):
        found.append("torchrun")
    st = proc.stat(pid)
    if st is not None and st.ppid in launchers:
        found.append(f"started by torchrun (PID {st.ppid})")
    if pid in holders:
        found.append(f"holds port {master_port}")
    if loads_torch(pid):
        found.append("torch loaded")
    return found


def training_processes(master_port: int) -> dict:
    """Processes of a training run: one that looks like training (training_reasons) and shows
    it (evidence); a process that only claims RANK, or only runs a train*.py, is not proof of a
    leftover run (any user can start one). This process and its ancestors are left out, and so
    are ddp-preflight's own node programs (hangwatch's agent of a run that just ended, another
    collector): the boot line they run is theirs alone. Each is said with its owner."""
    try:
        own_net = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        own_net = None
    mine = own_lineage()
    found = []
    holders = {h["pid"] for h in port_holders(master_port)["holders"]}
    seen = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine or not _same_network(int(entry), own_net):
            continue
        argv = proc.cmdline(int(entry))
        if argv and STAGE0 not in argv:
            seen[int(entry)] = argv
    launchers = {pid for pid, argv in seen.items() if ranks.is_launcher(argv)}
    for pid, argv in sorted(seen.items()):
        reasons = training_reasons(pid, argv)
        if not reasons:
            continue
        # Holding the port makes a training process matter more; alone it does not make one
        # (sshd holds 22): master-port names such a holder.
        shown = evidence(pid, argv, launchers, holders, master_port)
        if shown:
            found.append({**describe(pid), "why": reasons + [e for e in shown if e not in reasons],
                          **preflight_job(pid, argv, mine)})
    return {"processes": found, "scanned_at": time.time(), "euid": os.geteuid()}


def ptrace_facts() -> dict:
    scope_text = read("/proc/sys/kernel/yama/ptrace_scope")
    status = read("/proc/self/status", "") or ""
    cap_eff = 0
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            cap_eff = int(line.split()[1], 16)
    return {"ptrace_scope": int(scope_text) if scope_text else None, "euid": os.geteuid(),
            "cap_sys_ptrace": bool(cap_eff & (1 << 19)),
            "py_spy": pyspy.find()[0]}
