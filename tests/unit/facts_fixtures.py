"""The recorded lab facts as a Context, and variants derived from them by small, named edits.

lab_clean.json and lab_faulted.json are what the lab's nodes really reported (artifacts/record.py).
A variant is a deep copy of one of them with a few explicit edits, each commented with the
situation it stands for; nothing else about the recorded facts changes."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

from ddp_preflight.preflight.model import Context, NodeFacts, Options, Result

ARTIFACTS = Path(__file__).parent / "artifacts"

# The training command artifacts/record.py asked the master's torchrun to parse (seed 000's
# `--run=x`, which torchrun reads as an abbreviation of its own --run-path).
RECORDED_LAUNCH_ARGS = ("-m", "scripts.base_train", "--run=x", "--depth", "4")


# --- loading -----------------------------------------------------------------------------------

@functools.cache
def _recorded(name: str) -> str:
    return (ARTIFACTS / f"{name}.json").read_text()


def artifact(name: str) -> dict:
    """A fresh copy of a recorded artifact ("lab_clean" or "lab_faulted"): edit it freely.
    Its "options" are the recorded run's, taken before any variant drops a node's facts: the
    master address the workers dialled, the data folder when shards were collected, and the
    recorded training command when the master parsed one."""
    art = json.loads(_recorded(name))
    master = art["nodes"][0]["facts"]
    shards = master.get("shards")
    art["options"] = {
        "master_addr": art["master_addr"],
        "data_dir": shards["root"] if isinstance(shards, dict) and "root" in shards else None,
        "launch_args": RECORDED_LAUNCH_ARGS if "launch" in master else (),
    }
    return art


def clean() -> dict:
    return artifact("lab_clean")


def faulted() -> dict:
    return artifact("lab_faulted")


def entry(art: dict, node: str) -> dict:
    """The recorded entry of one node: {"node", "facts", "error", "fix"}."""
    return next(n for n in art["nodes"] if n["node"] == node)


def facts(art: dict, node: str) -> dict:
    return entry(art, node)["facts"]


def context(art: dict, **options) -> Context:
    """The Context the checks receive for this artifact: one NodeFacts per recorded node, and
    the recorded run's options (see artifact()); keyword arguments override them."""
    nodes = tuple(NodeFacts(n["node"], n["facts"], n["error"], n["fix"]) for n in art["nodes"])
    return Context(nodes, Options(**{**art["options"], **options}))


# --- looking at results ------------------------------------------------------------------------

def one(results: list[Result], check: str, node: str | None) -> Result:
    """The single result of `check` about `node`; fails the test when there is not exactly one."""
    found = [r for r in results if r.check == check and r.node == node]
    assert len(found) == 1, f"{check} on {node}: expected one result, got {found}"
    return found[0]


# --- derived variants: each returns an edited deep copy ------------------------------------------

def _copy(art: dict) -> dict:
    return copy.deepcopy(art)


def only(art: dict, *names: str) -> dict:
    """The same facts with only these nodes, in this order (the first is the master)."""
    art = _copy(art)
    art["nodes"] = [entry(art, n) for n in names]
    return art


def torch_version(art: dict, node: str, version: str = "2.9.1+cpu") -> dict:
    """`node` runs another torch release, e.g. a worker set up weeks before the master."""
    art = _copy(art)
    torch = facts(art, node)["torch"]
    torch["version"] = version
    # Another release is built from another commit (this one is made up; only "differs" matters).
    torch["git_version"] = "0" * 40
    return art


def torch_missing(art: dict, node: str) -> dict:
    """`node`'s training Python has no torch: the section is the error torch_facts() returns."""
    art = _copy(art)
    facts(art, node)["torch"] = {"error": "torch is not installed in this Python", "missing": True}
    return art


def python_version(art: dict, node: str, version: str) -> dict:
    art = _copy(art)
    facts(art, node)["python"]["version"] = version
    return art


# The shape code_facts() reports for a git checkout and for a folder without git.
def git_code(commit: str, *, dirty: bool = False, changes_hash: str | None = None) -> dict:
    return {"dir": "/home/me/nanochat", "git": True, "commit": commit, "dirty": dirty,
            "changed_files": ["scripts/base_train.py"] if dirty else [],
            "changed_count": 1 if dirty else 0, "changes_hash": changes_hash if dirty else None}


def tree_code(tree_hash: str) -> dict:
    return {"dir": "/home/me/nanochat", "git": False, "tree_hash": tree_hash}


def with_code(art: dict, **sections: dict) -> dict:
    """Adds a `code` section per node, as if --code-dir had been given: with_code(art, master=...)."""
    art = _copy(art)
    for node, section in sections.items():
        facts(art, node)["code"] = section
    return art


def loopback_bind(art: dict, node: str) -> dict:
    """Debian's /etc/hosts maps the hostname to 127.0.1.1: Gloo resolves it and binds loopback."""
    art = _copy(art)
    network = facts(art, node)["network"]
    network["hostname_resolves_to"] = [{"family": 4, "address": "127.0.1.1"}]
    # gloo_bind()'s answer for that resolution (interface_of() names "lo" for any 127.x).
    network["gloo_bind"] = {"source": "hostname", "hostname": network["hostname"], "interface": "lo",
                            "family": 4, "address": "127.0.1.1"}
    return art


def gloo_socket_ifname(art: dict, node: str, ifname: str) -> dict:
    """GLOO_SOCKET_IFNAME=`ifname` in `node`'s environment, and what gloo_bind() then reports."""
    art = _copy(art)
    node_facts = facts(art, node)
    node_facts["env"]["vars"]["GLOO_SOCKET_IFNAME"] = ifname
    iface = next((i for i in node_facts["network"]["interfaces"] if i["name"] == ifname), None)
    if iface is None or not iface["addresses"]:
        bind = {"source": "GLOO_SOCKET_IFNAME", "interface": ifname, "family": None, "address": None,
                "error": f"GLOO_SOCKET_IFNAME={ifname} names no interface with an address"}
    else:
        # Gloo takes the interface's first IPv4 address, else its first non-link-local IPv6 one.
        first = sorted(iface["addresses"], key=lambda a: (a["family"], a["scope"] == "link"))[0]
        bind = {"source": "GLOO_SOCKET_IFNAME", "interface": ifname,
                "family": first["family"], "address": first["address"]}
    node_facts["network"]["gloo_bind"] = bind
    return art


def relink(art: dict, node: str, old: str, new: str, kind: str, link_kind: str) -> dict:
    """`node`'s link to the master is `new` of `kind` instead of the recorded `old` (e.g. a
    WireGuard tunnel wg0, or a container bridge docker0): the interface, the route to the master
    and Gloo's bind all name it, as they would on such a machine."""
    art = _copy(art)
    network = facts(art, node)["network"]
    iface = next(i for i in network["interfaces"] if i["name"] == old)
    iface.update(name=new, kind=kind, link_kind=link_kind)
    if network["route_to_master"].get("interface") == old:
        network["route_to_master"]["interface"] = new
    if network["gloo_bind"].get("interface") == old:
        network["gloo_bind"]["interface"] = new
    return art


def port_held_by_other_user(art: dict) -> dict:
    """Port 29500 on the master is listened on by another user's process: without root,
    port_holders() sees the listening socket but cannot attribute it (unattributed)."""
    art = _copy(art)
    facts(art, "master")["master_port"].update(listening=True, holders=[], unattributed=1)
    return art


# sshd as Debian and Ubuntu show it: its listener retitles itself (one argv element).
SSHD_LISTENER = ["sshd: /usr/sbin/sshd -D [listener] 0 of 10-100 startups"]


def port_held_by_service(art: dict, port: int = 22, cmdline: list[str] = SSHD_LISTENER,
                         pid: int = 811) -> dict:
    """The master port asked for (e.g. --master-port 22) is a system service's: root's `pid`,
    started at boot by PID 1 (so its parent is 1). The process scan does not list it: it is
    not torchrun, not a rank and not a training script."""
    art = _copy(art)
    facts(art, "master")["master_port"].update(port=port, listening=True, unattributed=0, holders=[
        {"pid": pid, "ppid": 1, "uid": 0, "cmdline": list(cmdline), "age_seconds": 86400.0, "orphan": True}])
    return art


def processes_failed(art: dict, node: str) -> dict:
    """The process scan failed on `node`: the section is the error the collector reports."""
    art = _copy(art)
    facts(art, node)["processes"] = {"error": "PermissionError: [Errno 13] Permission denied: '/proc' (at processes.py:96)"}
    return art


def not_orphaned(art: dict, node: str, parent: int = 4242) -> dict:
    """The leftover training processes on `node` still have a live parent (e.g. a shell or
    tmux that started them): a run someone may still want, not debris."""
    art = _copy(art)
    for proc in facts(art, node)["processes"]["processes"]:
        proc.update(ppid=parent, orphan=False)
    return art


# An RTX 4070 as torch and /dev report it (seeds 001, 004: the master had one). Derived, because
# no GPU exists on the machine that recorded the artifacts.
RTX_4070 = {"index": 0, "name": "NVIDIA GeForce RTX 4070", "capability": [8, 9],
            "memory_bytes": 12_878_610_432}     # 12282 MiB, what torch reports for the 12 GB card


def with_gpu(art: dict, node: str = "master") -> dict:
    """`node` has an RTX 4070 and the CUDA build of the same torch release (derived: see RTX_4070)."""
    art = _copy(art)
    node_facts = facts(art, node)
    node_facts["gpu"].update(nvidia_devices=["nvidia0"],
                             nvidia_driver="NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.133.07")
    release = node_facts["torch"]["version"].split("+")[0]
    node_facts["torch"].update(version=f"{release}+cu128", cuda="12.8", build="cuda",
                               backends=["gloo", "nccl"], cuda_available=True,
                               cuda_devices=[dict(RTX_4070)])
    return art


def hide_gpu(art: dict, node: str = "master") -> dict:
    """CUDA_VISIBLE_DEVICES="" on `node`: torch then sees no device, /dev still has the card."""
    art = _copy(art)
    node_facts = facts(art, node)
    node_facts["env"]["vars"]["CUDA_VISIBLE_DEVICES"] = ""
    node_facts["torch"].update(cuda_available=False, cuda_devices=[])
    return art


def env(art: dict, node: str, **variables: str) -> dict:
    """Variables in `node`'s environment, as env_facts() collects them."""
    art = _copy(art)
    facts(art, node)["env"]["vars"].update(variables)
    return art


def without_bf16(art: dict, node: str) -> dict:
    """`node`'s CPU has no bf16 instructions (no avx512_bf16, no AMX), like the seeds' i9 and i5."""
    art = _copy(art)
    cpu = facts(art, node)["cpu"]
    cpu["flags"] = [f for f in cpu["flags"] if f != "avx512_bf16" and not f.startswith("amx")]
    cpu["bf16_instructions"] = []
    return art


def cores(art: dict, node: str, physical: int, logical: int | None = None) -> dict:
    """`node` has `physical` cores, all usable (no cgroup or affinity limit)."""
    art = _copy(art)
    facts(art, node)["cpu"].update(physical_cores=physical, usable_cores=physical,
                                   logical_cores=logical or physical)
    return art


def ptrace(art: dict, node: str, scope: int | None, euid: int, cap_sys_ptrace: bool) -> dict:
    """The Yama ptrace scope and the SSH user's privileges on `node`."""
    art = _copy(art)
    facts(art, node)["ptrace"].update(ptrace_scope=scope, euid=euid, cap_sys_ptrace=cap_sys_ptrace)
    return art


def clock(art: dict, node: str, shift: float, uncertainty: float | None = None) -> dict:
    """`node`'s clock `shift` seconds later than recorded (negative: earlier)."""
    art = _copy(art)
    sample = facts(art, node)["clock"]
    sample["offset"] += shift
    if uncertainty is not None:
        sample["uncertainty"] = uncertainty     # a slow round trip: the offset is only this sure
    return art


# What torchrun_parse() returned on this machine's torch 2.13.0+cpu (the lab's) for the command
# with `--` between the script and its options.
SEPARATED_LAUNCH_ARGS = ("-m", "scripts.base_train", "--", "--run=x", "--depth", "4")
SEPARATED_PARSE = {"parsed": True, "training_script": "scripts.base_train",
                   "training_script_args": ["--run=x", "--depth", "4"], "module": True,
                   "run_path": False, "no_python": False}
# A torchrun that accepts the recorded command but keeps --run=x for itself, as seed 000 tells
# ("--run=... was swallowed by torchrun itself"). Derived: 2.13's parser rejects it instead.
SWALLOWING_PARSE = {"parsed": True, "training_script": "scripts.base_train",
                    "training_script_args": ["--depth", "4"], "module": True,
                    "run_path": False, "no_python": False}


def launch(art: dict, parse: dict) -> dict:
    """The master's torchrun parse of the training command."""
    art = _copy(art)
    facts(art, "master")["launch"] = dict(parse)
    return art


def unreachable(art: dict, node: str) -> dict:
    """`node` refused the SSH connection: gather() keeps no facts, only the explained error."""
    from ddp_preflight.transport.errors import explain_connect

    art = _copy(art)
    why = explain_connect(node, ConnectionRefusedError(111, "Connection refused"))
    entry(art, node).update(facts={}, error=why.summary, fix=why.fix)
    return art
