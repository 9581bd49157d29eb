"""`ddp-preflight lab up|down|status|exec|fault|faults`."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from ddp_preflight.lab.errors import LabError
from ddp_preflight.lab.faults import FAULTS
from ddp_preflight.lab.lab import Lab
from ddp_preflight.lab.state import DEFAULT_LAB_NAME

from . import examples
from .args import Parser
from .exit import Exit, internal_error, reader_gone


def render_status(status: dict) -> str:
    lines = [f"lab {status['name']!r}: {len(status['nodes'])} nodes on {status['subnet4']} "
             f"and {status['subnet6']}"]
    width = max(len(n["name"]) for n in status["nodes"])
    for n in status["nodes"]:
        faults = ", ".join(n["faults"]) or "-"
        sshd = "sshd up" if n["sshd"] else "sshd DOWN"
        lines.append(f"  {n['name']:<{width}}  {n['ipv4']:<15} {n['ipv6']:<24} {n['iface']:<7} "
                     f"{sshd:<9}  faults: {faults}")
    lines.append(f"this machine: {status['operator']['ipv4']} on {status['operator']['iface']}")
    lines.append(f"data folder on every node: {status['data_dir']}")
    lines.append(f"ssh config: {status['ssh_config']}")
    if status.get("slurm"):
        lines.append(f"slurm: {status['slurm']['env']['SLURM_CONF']} (slurmctld on "
                     f"{status['nodes'][0]['name']}:{status['slurm']['ctld_port']})")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="ddp-preflight lab",
        description="A LAN of several machines on this box (network namespaces, each with its own addresses, "
                    "hostname, sshd and firewall), with the faults that break multi-node training on demand. "
                    "Needs root.",
        epilog=examples.LAB)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    default_name = os.environ.get("DDP_PREFLIGHT_LAB", DEFAULT_LAB_NAME)

    def with_name(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--name", default=default_name, metavar="LAB",
                       help=f"which lab (default: $DDP_PREFLIGHT_LAB or {DEFAULT_LAB_NAME!r})")
        return p

    up = with_name(sub.add_parser("up", help="create the nodes (safe to run twice)",
                                  description="Create the nodes: namespaces, a bridge, sshd, data folders; e.g. "
                                              "ddp-preflight lab up --nodes 3 --fault firewall@worker1"))
    up.add_argument("--nodes", type=int, default=2, metavar="N", help="how many nodes, 1-16 (default 2)")
    up.add_argument("--fault", action="append", default=[], metavar="FAULT@NODE[:PARAM]", type=_fault,
                    help="add a fault, e.g. firewall@worker1 (see 'lab faults'); repeatable")
    up.add_argument("--subnet", metavar="A.B.C.0/24", help="IPv4 /24 to use (default: a free one under 10.213.0.0/16)")
    up.add_argument("--shards", type=int, default=8, metavar="N", help="data shards per node (default 8)")
    up.add_argument("--slurm", action="store_true",
                    help="a real Slurm: slurmctld on the master, slurmd on every node (docs/lab.md)")
    with_name(sub.add_parser("down", help="remove everything 'up' created (safe to run twice)",
                             description="Remove everything 'up' created: processes, namespaces, links, files."))
    status = with_name(sub.add_parser("status", help="nodes, addresses and faults",
                                      description="The lab's nodes, their addresses, sshd and faults, the ssh "
                                                  "config and the data folder."))
    status.add_argument("--json", action="store_true",
                        help="one JSON object (nodes with name, ipv4, ipv6, iface, sshd, faults; ssh_config; "
                             "data_dir), for scripts")
    ex = with_name(sub.add_parser("exec", help="run a command inside a node (as root)",
                                  description="Run a command inside a node's network namespace, as root, "
                                              "e.g. ddp-preflight lab exec master -- ip -br addr",
                                  usage="ddp-preflight lab exec [--name LAB] NODE -- CMD [ARGS ...]"))
    ex.add_argument("node", metavar="NODE", help="a node's name (master, worker1, ...: see 'lab status')")
    ex.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS ...]", help="the command and its arguments")
    fault = sub.add_parser("fault", help="add or clear faults on a running lab",
                           description="Add or clear faults on a running lab ('lab faults' lists them).")
    fault_sub = fault.add_subparsers(dest="action", required=True, metavar="add|clear")
    add = with_name(fault_sub.add_parser("add", help="add faults, e.g. vpn-ipv6@worker1",
                                         description="Add faults to a running lab, e.g. vpn-ipv6@worker1 "
                                                     "port-busy@master:29500."))
    add.add_argument("faults", nargs="+", metavar="FAULT@NODE[:PARAM]", type=_fault, help="a fault, its node and its parameter")
    clear = with_name(fault_sub.add_parser("clear", help="clear faults (all by default)",
                                           description="Clear faults from a running lab: those named, or all."))
    clear.add_argument("faults", nargs="*", metavar="FAULT@NODE", help="the faults to clear (default: all)")
    sub.add_parser("faults", help="list the faults and what each reproduces",
                   description="List the faults 'up --fault' and 'fault add' take, and what each does to a node.")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except LabError as exc:
        print(f"ddp-preflight lab: error: {exc}", file=sys.stderr)
        return Exit.USAGE
    except BrokenPipeError:        # `lab status | head -1`
        return reader_gone()
    except KeyboardInterrupt:
        print(f"ddp-preflight lab: interrupted (Ctrl-C): 'ddp-preflight lab down --name {args.name}' removes what "
              "was made" if args.command == "up" else "ddp-preflight lab: interrupted (Ctrl-C)", file=sys.stderr)
        return Exit.INTERRUPTED
    except Exception as exc:       # a bug: one line and exit 2, never a traceback
        return internal_error("ddp-preflight lab", exc)


def _fault(text: str) -> str:
    """A fault as 'up --fault' and 'fault add' take it, judged as the lab will (FaultSpec.parse)
    before anything else, with the fault meant when its name is near one."""
    import difflib

    from ddp_preflight.lab.faults import FaultSpec
    try:
        FaultSpec.parse(text)
    except LabError as exc:
        kind = text.split("@", 1)[0]
        near = difflib.get_close_matches(kind, list(FAULTS), n=1, cutoff=0.75) if kind not in FAULTS else []
        raise argparse.ArgumentTypeError(f"{exc}{f' (did you mean {near[0]}?)' if near else ''}") from None
    return text


def _run(args: argparse.Namespace) -> int:
    if args.command == "faults":
        for kind in FAULTS.values():
            print(f"{kind.name:<14} {kind.what}")
        return Exit.OK
    if args.command == "up":
        started = time.monotonic()
        lab, built = Lab.up(args.name, nodes=args.nodes, faults=args.fault, subnet=args.subnet,
                            shard_count=args.shards, with_slurm=args.slurm)
        took = time.monotonic() - started
        print(("built in %.1f s" % took) if built else "already up")
        print(render_status(lab.status()))
        print(f"try: ssh -F {lab.ssh_config} worker1 hostname" if len(lab.nodes) > 1 else "")
        print(f"export DDP_PREFLIGHT_SSH_CONFIG={lab.ssh_config}")
        if lab.state.slurm:
            print(f"Slurm: cluster {lab.state.slurm['cluster']}, partition lab; from this machine:")
            for key, value in lab.status()["slurm"]["env"].items():
                print(f"export {key}={value}")
        return Exit.OK
    if args.command == "down":
        report = Lab.down(args.name)
        if report is None:
            print(f"no lab named {args.name!r} is up")
            return Exit.OK
        print(f"lab {args.name!r} is down; stopped {len(report.stopped)} processes in its nodes")
        for problem in report.problems:
            print(f"  could not remove: {problem}", file=sys.stderr)
        return Exit.FOUND if report.problems else Exit.OK
    if args.command == "exec" and os.geteuid() != 0:
        # Entering a node's network namespace (nsenter) needs root: said before nsenter's own words.
        raise LabError(f"lab exec enters node {args.node}'s network namespace, which only root may do: run it as "
                       f"root (sudo {sys.executable} -m ddp_preflight lab exec {args.node} -- CMD)")
    lab = Lab.open(args.name)
    if args.command == "status":
        status = lab.status()
        print(json.dumps(status, indent=2) if args.json else render_status(status))
        return Exit.OK
    if args.command == "exec":
        argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not argv:
            raise LabError("lab exec needs a command: ddp-preflight lab exec NODE -- CMD [ARGS]")
        lab.node(args.node)
        return subprocess.call(lab.command(args.node, argv))
    if args.command == "fault":
        if args.action == "add":
            for text in args.faults:
                lab.add_fault(text)
                print(f"added {text}")
        else:
            removed = lab.clear_faults(args.faults or None)
            print("cleared " + (", ".join(removed) if removed else "nothing"))
        return Exit.OK
    raise AssertionError(args.command)
