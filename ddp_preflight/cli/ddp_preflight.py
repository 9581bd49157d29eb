"""The `ddp-preflight` command: preflight on hosts (then --launch), or `lab ...` for the lab."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import sys
from pathlib import Path

from . import examples
from .args import PreflightParser, host, misspelt_command, nearest_checks, nproc, ssh_config_missing
from .completion import Completion
from .exit import Exit, internal_error, reader_gone
from .folders import code_dir_of, data_dir_of_each, python_of, pythons_given
from .progress import color_wanted, progress
from .version import version


def _parser() -> argparse.ArgumentParser:
    p = PreflightParser(
        prog="ddp-preflight",
        usage="ddp-preflight [HOST ...] [options] [-- TRAINING COMMAND]\n"
              "       ddp-preflight HOST ... --launch [--nproc-per-node N] [--env [NODE:]K=V ...] -- SCRIPT|-m MODULE [ARGS]\n"
              "       ddp-preflight lab up|down|status|exec|fault|faults ...\n"
              "       ddp-preflight explain PATH ... [--json]",
        description="Check every node before PyTorch distributed training. The first host is the "
                    "master (rank 0's node); no host checks this machine alone.",
        epilog=examples.PREFLIGHT)
    p.add_argument("--version", action="version", version=f"ddp-preflight {version()}")
    p.add_argument("--completion", choices=["bash"], action=Completion,
                   help='print a bash completion script and exit: eval "$(ddp-preflight --completion bash)"')
    p.add_argument("hosts", nargs="*", type=host, metavar="HOST", help="ssh aliases or addresses; the first is the master")
    p.add_argument("--hostfile", metavar="FILE", help="hosts from a DeepSpeed/MPI hostfile ('host slots=N')")
    p.add_argument("--slurm", action="store_true",
                   help="hosts from $SLURM_JOB_NODELIST; inside an allocation ($SLURM_JOB_ID) reached through srun")
    p.add_argument("--slurm-job", metavar="ID", help="the nodes of this running Slurm job, reached through srun")
    p.add_argument("--min-time-left", type=float, metavar="MINUTES",
                   help="inside a Slurm job, warn when it has less time left than this (default 10)")
    p.add_argument("--config", metavar="FILE", help="TOML config with defaults and [nodes.NAME] overrides")
    p.add_argument("--ssh-config", metavar="FILE",
                   help="OpenSSH client config (default: $DDP_PREFLIGHT_SSH_CONFIG, else ~/.ssh/config)")
    p.add_argument("--python", action="append", default=[], metavar="[NODE:]PATH",
                   help="the training environment's Python: PATH on every node, or NODE:PATH for a node whose "
                        "Python differs (repeatable; default: this interpreter's path; as python in [nodes.NAME])")
    p.add_argument("--data-dir", action="append", default=[], metavar="[NODE:]PATH",
                   help="the folder of training shards, compared across nodes: PATH on every node, or NODE:PATH "
                        "for a node whose folder differs (repeatable; as data_dir in [nodes.NAME] of --config)")
    p.add_argument("--code-dir", action="append", default=[], metavar="[NODE:]PATH",
                   help="the training code's folder, compared across nodes (and where a node's launch starts): "
                        "PATH on every node, or NODE:PATH for one (repeatable)")
    p.add_argument("--backend", choices=["gloo", "nccl"], help="default gloo")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default cpu")
    p.add_argument("--master-port", "--master_port", type=int, metavar="PORT", help="default 29500")
    p.add_argument("--master-addr", "--master_addr", metavar="ADDR",
                   help="the address workers dial (default: the master's, as ssh reaches it)")
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=nproc, metavar="N|auto",
                   help="processes per node (default 1, or the hostfile's slots); auto: as torchrun's, each node's "
                        "GPUs on a CUDA run, its CPUs on a CPU run (every node must have as many)")
    p.add_argument("--params", type=float, metavar="N",
                   help="model parameters (e.g. 126e6): predicts communication time per step")
    p.add_argument("--scan", metavar="PATH", help="training code to scan for collective calls the backend fails")
    p.add_argument("--env", action="append", default=[], metavar="[NODE:]NAME=VALUE",
                   help="a variable of the training's environment, on every node (NAME=VALUE) or on one "
                        "(NODE:NAME=VALUE); repeatable. The checks judge it and --launch sets it (it wins over "
                        "preflight's own settings and the config's [env]); keep secrets in the config instead")
    p.add_argument("--only", metavar="ID,...", help="comma-separated check ids (see --list)")
    p.add_argument("--no-probes", action="store_true",
                   help="facts only: skip the checks that try connections and collectives across nodes")
    p.add_argument("--list", action="store_true", help="list the checks and exit")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--junit", metavar="FILE", help="also write a JUnit XML file (one testcase per check and node)")
    p.add_argument("--strict", action="store_true", help="warnings fail too (exit 1)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="show passing checks and the skipped ones too, and preflight's own time per stage (on stderr)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no table and no progress: the nodes not reached, the fixes and the verdict line only")
    p.add_argument("--no-color", action="store_true", help="plain text, no colors (as NO_COLOR=1 does)")
    launch = p.add_argument_group("launch (after preflight, start the training command given after --)")
    launch.add_argument("--launch", action="store_true",
                        help="start torchrun on every node with preflight's settings, stream every rank's output here")
    launch.add_argument("--force", action="store_true", help="launch even when a check failed")
    launch.add_argument("--log-dir", "--log_dir", metavar="DIR",
                        help="where each node's log goes (default ./ddp-preflight-runs/UTC-TIME/)")
    launch.add_argument("--stop-on-hang", action="store_true",
                        help="stop every node when hangwatch names a hang as certain (its bundle is written first)")
    launch.add_argument("--no-flight-recorder", action="store_true",
                        help="run each rank as plain `python SCRIPT`, without the bootstrap that lets hangwatch read "
                             "its Flight Recorder: a hang is then named without collective numbers")
    launch.add_argument("--tui", action="store_true",
                        help="the dashboard on this terminal: ranks, hangwatch diagnosis, preflight results")
    launch.add_argument("--endless-after", type=float, metavar="SECONDS",
                        help="hangwatch names a rank that computes this long while the others wait for it "
                             "(default 5x hangwatch's threshold, 40 s)")
    launch.add_argument("--node-lease", type=float, metavar="SECONDS",
                        help="a node that hears nothing from this machine for this long stops its part of the run "
                             "(the link is down, or this machine is gone; default 60)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    misspelt_command(argv)
    if argv[:1] == ["lab"]:
        from .lab import main as lab_main
        return lab_main(argv[1:])
    if argv[:1] == ["explain"]:
        from .explain import main as explain_main
        return explain_main(argv[1:])
    launch_args: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, launch_args = argv[:at], argv[at + 1:]
    args = _parser().parse_args(argv)
    try:
        launch = _launch_request(args, launch_args)
        return _preflight(args, launch_args, launch)
    except KeyboardInterrupt:
        print("ddp-preflight: interrupted", file=sys.stderr)
        return Exit.INTERRUPTED
    except BrokenPipeError:
        return reader_gone()
    except UsageError as exc:
        from ddp_preflight.node.terminal import shown  # it may quote a hostfile's line: shown, never obeyed
        print(f"ddp-preflight: error: {shown(str(exc))}", file=sys.stderr)
        return Exit.USAGE
    except Exception as exc:   # a bug: one line and exit 2, never a traceback that looks like a finding
        return internal_error("ddp-preflight", exc)


class UsageError(Exception):
    pass


def _launch_request(args: argparse.Namespace, launch_args: list[str]):
    """The launch's own input, checked before any node is contacted: the command, or None."""
    if not args.launch:
        used = [flag for flag, value in (("--force", args.force), ("--log-dir", args.log_dir),
                                         ("--tui", args.tui), ("--node-lease", args.node_lease is not None),
                                         ("--endless-after", args.endless_after is not None),
                                         ("--stop-on-hang", args.stop_on_hang),
                                         ("--no-flight-recorder", args.no_flight_recorder)) if value]
        if used:
            raise UsageError(f"{used[0]} goes with --launch")
        return None
    from ddp_preflight.launch import PlanError, parse_command

    from .launch import log_dir_problem
    if args.node_lease is not None and not 5 <= args.node_lease <= 86400:
        raise UsageError(f"--node-lease {args.node_lease:g}: give 5 to 86400 seconds (a node must outlast a "
                         "few missed heartbeats, one a second)")
    try:
        request = parse_command(launch_args)
    except PlanError as exc:
        raise UsageError(str(exc)) from None
    problem = log_dir_problem(args.log_dir)
    if problem:
        raise UsageError(problem)
    return request


def _preflight(args: argparse.Namespace, launch_args: list[str], launch=None) -> int:
    from ddp_preflight.preflight.checks import CHECKS, UnknownCheck, select
    from ddp_preflight.preflight.config import ConfigError, load
    from ddp_preflight.preflight.model import Options
    from ddp_preflight.preflight.nproc_auto import NprocError

    if args.list:
        for check in CHECKS:
            print(f"{check.id:<18} {check.title}")
        return Exit.OK
    try:
        config = load(args.config)
        checks = select(args.only.split(",") if args.only else None)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    except UnknownCheck as exc:
        raise UsageError(f"{exc}{nearest_checks(args.only)}") from None

    slurm_job = _slurm_job(args)
    hosts, slots, host_slots = _hosts(args, config, slurm_job)
    training_env = _training_env(args, config, hosts)
    data_paths, code_paths = _folders(args, hosts)
    from ddp_preflight.preflight.hosts import HostListError
    try:
        args.python_paths = pythons_given(args, hosts or [socket.gethostname()])
    except HostListError as exc:
        raise UsageError(str(exc)) from None

    def pick(name, default):
        value = getattr(args, name)
        return value if value is not None else config.values.get(name, default)

    backend, device = pick("backend", "gloo"), pick("device", "cpu")
    if backend not in ("gloo", "nccl") or device not in ("cpu", "cuda"):
        raise UsageError(f"backend must be gloo or nccl and device cpu or cuda (got {backend!r}, {device!r})")
    try:
        auto = pick("nproc_per_node", slots or 1) == "auto"
        master_port, nprocs = int(pick("master_port", 29500)), 1 if auto else int(pick("nproc_per_node", slots or 1))
    except (TypeError, ValueError):
        raise UsageError("master_port and nproc_per_node must be whole numbers") from None
    try:
        min_time_left = 60 * float(pick("min_time_left", 10))
    except (TypeError, ValueError):
        raise UsageError("min_time_left must be a number of minutes") from None
    # Each node's own folder (--data-dir NODE:PATH, else [nodes.NAME] data_dir), unless --data-dir
    # PATH names one for every node, which wins over the config's.
    names = hosts or [socket.gethostname()]
    targets_data = data_dir_of_each(data_paths, config, names)
    options = Options(
        backend=backend, device=device, master_port=master_port, master_addr=pick("master_addr", None),
        nproc_per_node=nprocs, nproc_auto=auto, launch_args=tuple(launch_args),
        params=int(args.params) if args.params else None, scan=args.scan,
        # A data folder given only per node (NODE:PATH, config [nodes.X]) still means: compare shards.
        data_dir=data_paths.every or config.values.get("data_dir") or next((d for d in targets_data if d), None),
        env=training_env, launch=launch is not None, min_time_left=min_time_left,
        data_dirs={h: d for h, d in zip(names, targets_data, strict=True) if d},
        pythons={h: p.path for h in hosts or [socket.gethostname()] if (p := python_of(args, config, h)).named},
        nprocs=host_slots)
    if options.nproc_per_node < 1:
        given = "--nproc-per-node" if args.nproc_per_node is not None else "nproc_per_node in the config"
        raise UsageError(f"{given} is {options.nproc_per_node}: every node runs at least one process, give 1 or more")
    if not 0 < options.master_port < 65536:
        raise UsageError(f"--master-port {options.master_port} is not a port number")
    if args.scan and not Path(args.scan).exists():
        # Read on this machine (preflight/probes/code_scan.py): a path that is not here scans nothing.
        raise UsageError(f"--scan {args.scan}: no such file or folder on this machine: give the training code's "
                         "folder or .py file as this machine sees it")
    ssh_config = pick("ssh_config", None) or os.environ.get("DDP_PREFLIGHT_SSH_CONFIG")
    if ssh_config and not Path(ssh_config).is_file():
        if hosts or pick("ssh_config", None):
            raise UsageError(ssh_config_missing(ssh_config, given=bool(pick("ssh_config", None))))
        ssh_config = None      # no host: a purely local run, which no ssh config the environment names concerns
    if hosts and slurm_job is None:
        from ddp_preflight.transport.ssh import ssh_config_problem
        problem = ssh_config_problem(ssh_config)
        if problem:
            raise UsageError(problem)

    if args.no_probes:
        checks = tuple(c for c in checks if not c.needs)
    if args.junit and not Path(args.junit).resolve().parent.is_dir():
        raise UsageError(f"--junit {args.junit}: the folder {Path(args.junit).parent} does not exist: create it or "
                         "give a file in an existing folder")
    # A node not reached is said whatever --only selects: without it the report would be "OK" of nothing.
    reachability = [c for c in CHECKS if c.id == "node-reachable"]
    added = not any(c.id == "node-reachable" for c in checks)
    if added:
        checks = (*reachability, *checks)
    targets = _targets(args, config, hosts, launch_args, targets_data, code_paths)
    from ddp_preflight.preflight import api
    from ddp_preflight.preflight.cluster import Cluster

    with Cluster(targets, ssh_config, slurm_job) as cluster:
        in_ranks = None
        if launch is not None and not args.no_probes:     # the torch probes in the training's ranks (cli/launch.py)
            from .launch import in_ranks_for
            in_ranks = in_ranks_for(args, cluster, targets, launch)
        with progress(targets, quiet=args.json or args.quiet, color=color_wanted(args)) as hashing:
            try:
                done = api.check(cluster, options, checks, on_progress=hashing, in_ranks=in_ranks)
            except NprocError as exc:
                raise UsageError(str(exc)) from None
        if args.verbose:        # preflight's own time per stage, beside the report
            for stage, seconds in done.stages:
                print(f"ddp-preflight: stage {stage} {seconds:.1f} s", file=sys.stderr)
        if added:
            kept = tuple(r for r in done.report.results if r.check != "node-reachable" or r.status.severity >= 2)
            done = dataclasses.replace(done, report=dataclasses.replace(done.report, results=kept))
        code = _render(args, done.report)
        if launch is None or code == Exit.USAGE:
            if in_ranks is not None:
                in_ranks.refuse()
            return code
        # The connections preflight opened carry the training: no new handshakes.
        from .launch import launch_training
        return launch_training(args, cluster, done, targets, launch, in_ranks)


def _render(args, report) -> int:
    if args.junit:
        from ddp_preflight.node.private import write_file
        from ddp_preflight.preflight.report import junit
        try:
            # As every file this tool writes: never through a link another user put on the way.
            write_file(args.junit, junit.render(report, strict=args.strict))
        except OSError as exc:
            print(f"ddp-preflight: cannot write {args.junit}: {exc.strerror}", file=sys.stderr)
            return Exit.USAGE
    if args.json:
        print(json.dumps({**report.to_json(strict=args.strict), "version": version()}, indent=2))
    else:
        from ddp_preflight.preflight.report import text
        width = (os.get_terminal_size().columns or 120) if sys.stdout.isatty() else 120   # a pty may say 0
        sys.stdout.write(text.render(report, width=width, color=color_wanted(args) and sys.stdout.isatty(),
                                     verbose=args.verbose, quiet=args.quiet))
    ok = report.ok_strict() if args.strict else report.ok
    return Exit.OK if ok else Exit.FOUND


def _training_env(args: argparse.Namespace, config, hosts: list[str]):
    """The config's [env] and [nodes.NAME.env], then --env: checked before any node is contacted."""
    from ddp_preflight.rules.training_env import EnvError, TrainingEnv, from_config, parse_env_args

    names = hosts or [socket.gethostname()]
    try:
        given = parse_env_args(args.env, names)
    except EnvError as exc:
        raise UsageError(str(exc)) from None
    return TrainingEnv(tuple(from_config(config.env, config.node_env) + given), config.path)


def _slurm_job(args: argparse.Namespace):
    """The Slurm job whose nodes preflight reaches through srun: --slurm-job ID, or --slurm in one; else None."""
    job_id = args.slurm_job or (os.environ.get("SLURM_JOB_ID") if args.slurm else None)
    if not job_id:
        return None
    from ddp_preflight.transport.slurm import SlurmError, read_job
    try:
        return read_job(job_id)
    except SlurmError as exc:
        raise UsageError(str(exc)) from None


def _hosts(args: argparse.Namespace, config, slurm_job=None) -> tuple[list[str], int | None, dict[str, int]]:
    """Every host from the command line, the hostfile and Slurm (else the config), each machine once;
    and the processes per node the hostfile's slots ask for, when they decide it (the most, and each
    host's own where they differ). Every host of every source passes the one check (transport/host_names.py)
    here, before anything is done with it: one line naming the host and where it came from, exit 2."""
    from ddp_preflight.preflight.hosts import (
        MAX_HOSTS,
        HostListError,
        check_hosts,
        check_unique,
        hostfile_slots,
        read_hostfile,
        slurm_hosts,
    )

    sources = [("the command line", list(args.hosts))]
    slots, host_slots = None, dict[str, int]()
    try:
        check_hosts(*sources[0])
        if args.hostfile:
            entries = read_hostfile(args.hostfile)      # checks each line's host itself, naming the line
            sources.append((f"hostfile {args.hostfile}", [e.host for e in entries]))
            if args.nproc_per_node is None and config.values.get("nproc_per_node") is None:
                slots, host_slots = hostfile_slots(entries, args.hostfile)
        if args.slurm_job and slurm_job is not None:
            sources.append((f"Slurm job {slurm_job.job_id}", list(slurm_job.nodes)))   # checked by read_job
        elif args.slurm:
            sources.append(slurm_hosts(os.environ))
        if not any(hosts for _, hosts in sources):
            sources.append((f"config {config.path} (hosts)", list(config.values.get("hosts", []))))
            check_hosts(*sources[-1])
        total = sum(len(hosts) for _, hosts in sources)
        if total > MAX_HOSTS:
            raise HostListError(f"{' and '.join(origin for origin, hosts in sources if hosts)} list {total} hosts, "
                                f"more than the {MAX_HOSTS} ddp-preflight takes; give the hosts of one run")
        check_unique(sources)
    except HostListError as exc:
        raise UsageError(str(exc)) from None
    return [host for _, hosts in sources for host in hosts], slots, host_slots


def _folders(args: argparse.Namespace, hosts: list[str]):
    """--data-dir and --code-dir, each PATH for every node or NODE:PATH for one, checked before any node is."""
    from ddp_preflight.preflight.hosts import HostListError, node_paths

    names = hosts or [socket.gethostname()]
    try:
        return (node_paths("--data-dir", args.data_dir or [], names),
                node_paths("--code-dir", args.code_dir or [], names))
    except HostListError as exc:
        raise UsageError(str(exc)) from None


def _targets(args, config, hosts, launch_args, data_dirs=None, code_paths=None):
    """Each node's Target; `data_dirs`: each node's data folder, in host order; `code_paths`:
    --code-dir as given (both from the arguments when not given). A node's own folder
    (NODE:PATH) wins over the one for every node, and the command line over the config."""
    from ddp_preflight.preflight.cluster import Target

    if data_dirs is None or code_paths is None:
        data_paths, code_paths = _folders(args, hosts)
        data_dirs = data_dir_of_each(data_paths, config, hosts or [socket.gethostname()])
    code_dir = code_paths.every or config.values.get("code_dir") or code_dir_of(launch_args)
    if not hosts:
        here = socket.gethostname()
        return [Target(here, python_of(args, config, here).path, data_dirs[0],
                       code_paths.nodes.get(here) or code_dir, local=True)]
    return [Target(h, python_of(args, config, h).path, data_dir,
                   code_paths.nodes.get(h) or code_paths.every or config.for_node(h, "code_dir", code_dir))
            for h, data_dir in zip(hosts, data_dirs, strict=True)]


if __name__ == "__main__":
    sys.exit(main())
