"""The `hangwatch` command: `hangwatch attach [HOST ...] [--pid [HOST:]PID ...]`.

Text events by default, `--json` for one JSON object per event, `--tui` for the dashboard. The
watch ends with the run it follows (every rank ended, its torchruns leaving), unless
--keep-watching; when no node holds a rank or a torchrun, it says so within seconds.
Exit codes: 0 the run finished (every rank exited 0), or watched until stopped (or --for ran out)
with no hang; 1 a hang was named, or a rank of the run did not exit 0; 2 usage error, no node
could be watched, no rank found, or the watch's own crash (whatever it named before: a hang may
have gone unnamed)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

from ddp_preflight.hangwatch import stall

from . import examples
from .args import SSH_WORDS, Parser, ssh_config_missing
from .exit import Exit, internal_error
from .version import version

if TYPE_CHECKING:
    from ddp_preflight.transport.slurm import SlurmJob


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="hangwatch", description="Watch PyTorch distributed ranks; name a hang, "
                                "its rank and its line, within seconds.", epilog=examples.HANGWATCH,
               known=SSH_WORDS)
    p.add_argument("--version", action="version", version=f"hangwatch (ddp-preflight) {version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    a = sub.add_parser("attach", help="watch the ranks on these nodes (default: this machine)",
                       description="Find the ranks of a PyTorch distributed run on these nodes (over ssh; "
                                   "none: this machine) and watch them: a hang is named with its rank, its "
                                   "line and why, and an incident bundle is written.", epilog=examples.HANGWATCH)
    a.add_argument("hosts", nargs="*", metavar="HOST", help="ssh aliases or addresses; none: this machine")
    a.add_argument("--pid", action="append", default=[], metavar="[HOST:]PID",
                   help="watch this process as a rank whatever it looks like, on HOST (default: the first "
                        "host, or this machine); repeatable, on any host")
    a.add_argument("--ssh-config", metavar="FILE",
                   help="OpenSSH client config (default: $DDP_PREFLIGHT_SSH_CONFIG, else ~/.ssh/config)")
    a.add_argument("--python", metavar="PATH",
                   help="the training environment's Python on the nodes (default: this interpreter's path)")
    a.add_argument("--slurm-job", metavar="ID",
                   help="watch the ranks on this Slurm job's nodes (default: all of them), "
                        "through one srun --overlap step instead of ssh; a job still pending is waited for")
    a.add_argument("--threshold", type=float, default=stall.DEFAULT_THRESHOLD, metavar="SECONDS",
                   help=f"seconds without progress before a hang is named (default {stall.DEFAULT_THRESHOLD:g})")
    a.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="CPU sampling interval, seconds (default 1)")
    a.add_argument("--endless-after", type=float, metavar="SECONDS",
                   help="a rank that computes this long while the others wait for it is named as a hang "
                        "(default 5x the threshold; a straggler that arrives before is never a hang)")
    a.add_argument("--native", action="store_true", help="include native frames in stacks (slower dumps)")
    a.add_argument("--json", action="store_true", help="one JSON object per event on stdout")
    a.add_argument("--tui", action="store_true", help="the dashboard instead of the event stream")
    a.add_argument("--on-hang", metavar="CMD", help="run CMD with the incident bundle's path as its last argument")
    a.add_argument("--incident-dir", default="hangwatch-incidents", metavar="DIR",
                   help="where bundles go (default ./hangwatch-incidents)")
    a.add_argument("--for", dest="duration", type=float, metavar="SECONDS", help="stop watching after this many seconds")
    a.add_argument("--exit-on-hang", action="store_true",
                   help="stop at the first hang named as certain (exit 1): for CI and scripts")
    a.add_argument("--keep-watching", action="store_true",
                   help="watch on when the run ends, and when no rank is found yet: for the runs to come")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.endless_after is not None and args.endless_after < args.threshold:
        print(f"hangwatch: error: --endless-after {args.endless_after:g} is shorter than the threshold "
              f"({args.threshold:g} s): give {args.threshold:g} or more, or a lower --threshold", file=sys.stderr)
        return Exit.USAGE
    if args.duration is not None and args.duration <= 0:
        print(f"hangwatch: error: --for {args.duration:g}: give the seconds to watch, more than 0", file=sys.stderr)
        return Exit.USAGE
    if args.threshold < 2 or args.interval <= 0 or args.interval > args.threshold / 4:
        print("hangwatch: error: --threshold must be at least 2 s, and --interval positive and at most "
              "a quarter of the threshold",
              file=sys.stderr)
        return Exit.USAGE
    try:
        return attach(args)
    except KeyboardInterrupt:
        return Exit.INTERRUPTED
    except UsageError as exc:
        from ddp_preflight.node.terminal import shown  # it may quote Slurm's words: shown, never obeyed
        print(f"hangwatch: error: {shown(str(exc))}", file=sys.stderr)
        return Exit.USAGE
    except Exception as exc:   # a bug: one line and exit 2, never a traceback
        return internal_error("hangwatch", exc)


class UsageError(Exception):
    pass


def given_pids(given: list[str], hosts: list[str], aliases: tuple[str, ...] = ()) -> dict[str, tuple[int, ...]]:
    """--pid's processes by host: "HOST:PID" on that host (one of those watched; an IPv6 address
    keeps its colons: the last one splits), a bare PID on the first host. UsageError otherwise."""
    out: dict[str, list[int]] = {}
    for value in given:
        host, colon, number = value.rpartition(":")
        host = host.strip("[]") if colon else hosts[0]
        if host in aliases:
            host = hosts[0]
        if not number.isdigit() or int(number) <= 0:
            raise UsageError(f"--pid {value!r}: give PID or HOST:PID, PID a process id")
        if host not in hosts:
            raise UsageError(f"--pid {value!r}: {host} is not a watched host (watched: {', '.join(hosts)})")
        out.setdefault(host, []).append(int(number))
    return {host: tuple(pids) for host, pids in out.items()}


def missing_pids(target) -> tuple[int, ...]:
    """The --pid processes of a target on this machine that do not exist."""
    import os
    return tuple(pid for pid in target.pids if not os.path.exists(f"/proc/{pid}"))


def _checked_input(args) -> tuple[str | None, SlurmJob | None]:
    """The ssh config and the Slurm job, and every host (the command line's, the job's) through
    the one check, before any node is contacted or any ssh config is read: raises UsageError
    (one line naming the host and where it came from)."""
    from ddp_preflight.transport.host_names import HostListError, check_hosts
    from ddp_preflight.transport.slurm_job import SlurmError, wait_until_running
    from ddp_preflight.transport.ssh import ssh_config_problem

    try:
        check_hosts("the command line", args.hosts)
    except HostListError as exc:
        raise UsageError(str(exc)) from None
    slurm_job = None
    if args.slurm_job:
        try:
            # A job still pending (or held, or its nodes booting) is waited for, as squeue says it.
            slurm_job = wait_until_running(args.slurm_job, lambda said: print(f"hangwatch: {said}", file=sys.stderr,
                                                                            flush=True))
        except SlurmError as exc:
            raise UsageError(str(exc)) from None
    ssh_config = args.ssh_config or os.environ.get("DDP_PREFLIGHT_SSH_CONFIG")
    if args.hosts and slurm_job is None:
        if ssh_config and not os.path.isfile(ssh_config):
            raise UsageError(ssh_config_missing(ssh_config, given=bool(args.ssh_config)))
        problem = ssh_config_problem(ssh_config)
        if problem:
            raise UsageError(problem)
    return ssh_config, slurm_job


def _connect(hosts: list[str], ssh_config: str | None, python: str, slurm_job=None):
    """Open each node's connection in parallel (SSH, or the Slurm job's one srun step); a node
    that fails is reported, not fatal."""
    from concurrent.futures import ThreadPoolExecutor

    from ddp_preflight.hangwatch.watch import WatchTarget
    from ddp_preflight.transport import NodeError, SshNode
    from ddp_preflight.transport.slurm import SlurmNode, SlurmStep

    step = SlurmStep(slurm_job, python) if slurm_job is not None else None

    def one(host):
        node = SlurmNode(host, python, step) if step is not None else SshNode(host, python, ssh_config)
        try:
            node.connect()
        except NodeError as exc:
            return node, f"{exc.summary}" + (f"; fix: {exc.fix}" if exc.fix else "")
        except Exception as exc:   # still this node's one line: the others are watched
            return node, f"{host}: {type(exc).__name__}: {exc}"
        return node, None

    with ThreadPoolExecutor(min(32, len(hosts))) as pool:
        results = list(pool.map(one, hosts))
    targets = [WatchTarget(n) for n, err in results if err is None]
    return targets, [n for n, _ in results], [err for _, err in results if err]


def attach(args) -> int:
    from ddp_preflight.hangwatch.watch import Watcher, WatchTarget
    from ddp_preflight.rules.python import training_python

    python = training_python(args.python).path       # the same answer as preflight's and the launch's
    ssh_config, slurm_job = _checked_input(args)
    out = sys.stdout
    problems: list[str] = []
    nodes = []
    if args.hosts or slurm_job is not None:
        hosts = args.hosts or list(slurm_job.nodes if slurm_job is not None else ())
        pids = given_pids(args.pid, hosts)
        targets, nodes, problems = _connect(hosts, ssh_config, python, slurm_job)
        targets = [WatchTarget(t.node, pids.get(t.name, ())) for t in targets]
    else:
        import socket

        from ddp_preflight.transport import LocalNode
        here = socket.gethostname()
        pids = given_pids(args.pid, [here], aliases=("localhost",))
        targets = [WatchTarget(LocalNode(here, python), pids.get(here, ()))]
    for target in targets:
        gone = missing_pids(target) if target.node.is_local else ()
        if gone:
            raise UsageError(f"--pid {gone[0]}: no such process on {target.name}; give the pid of a running rank or "
                             "torchrun (ps -ef)")
    from ddp_preflight.node.terminal import shown  # a node's error may quote its words: shown, never obeyed
    for problem in problems:
        print(f"hangwatch: {shown(problem)}", file=sys.stderr)
    if not targets:
        print("hangwatch: no node could be watched", file=sys.stderr)
        return Exit.USAGE

    from ddp_preflight.hangwatch.events import Event, EventKind

    hung, alone, missing = threading.Event(), threading.Event(), threading.Event()
    missing_text: list[str] = []
    stops = threading.Event()       # a certain hang was named: --exit-on-hang acts on it alone
    failed = nothing = False
    write_lock = threading.Lock()

    def on_event(event):
        if event.hang:
            hung.set()
        if event.data.get("missing"):
            missing_text.append(event.text)          # a --pid of no process on a remote node: usage
            missing.set()
            return
        if "alone" in event.data:
            # Ranks of a world of more than one that never connected: no hang (nothing stops), but
            # the run is not what it claims to be, so it fails (exit 1) unless they connect after all.
            (alone.set if event.data["alone"] else alone.clear)()
        if args.tui:
            return
        with write_lock:
            if args.json:
                from ddp_preflight.hangwatch.render import snapshot_json
                record = {"event": event.kind.value, "time": time.time(), "text": event.text, **event.data}
                if event.snapshot is not None:
                    record["snapshot"] = snapshot_json(event.snapshot)
                out.write(json.dumps(record) + "\n")
            else:
                from ddp_preflight.hangwatch.render import diagnosis_block, event_line
                out.write(event_line(event.kind, event.text) + "\n")
                if event.hang and event.snapshot is not None:
                    out.write("".join(f"    {line}\n" for line in diagnosis_block(event.snapshot).splitlines()[1:]))
            out.flush()

    def on_hang(path: str, certain: bool) -> None:
        if certain:
            stops.set()
        if args.on_hang:
            # The user's command, with the bundle's path; it runs beside the watch, never blocking it.
            subprocess.Popen(f"{args.on_hang} {shlex.quote(path)}", shell=True,
                             env={**os.environ, "HANGWATCH_INCIDENT": path})

    watcher = Watcher(targets, threshold=args.threshold, interval=args.interval, native=args.native,
                      on_event=on_event, on_hang=on_hang, incident_dir=args.incident_dir,
                      endless_after=args.endless_after)
    for problem in problems:
        watcher.notice(problem)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    watcher.start()
    try:
        if args.tui:
            from ddp_preflight.tui.app import run_dashboard
            run_dashboard(watcher)
        else:
            deadline = time.monotonic() + args.duration if args.duration else None
            while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
                if args.exit_on_hang and stops.is_set():
                    break
                if missing.is_set():
                    from ddp_preflight.node.terminal import shown
                    print(f"hangwatch: error: {shown(missing_text[0])}", file=sys.stderr)
                    nothing = True
                    break
                if not args.keep_watching:
                    ended = watcher.over()
                    if ended is not None:
                        on_event(Event(EventKind.FINISHED, over_text(ended), data=over_data(ended)))
                        failed = bool(ended.failed or ended.alone)
                        break
                    empty = watcher.none_found()
                    if empty:
                        print(f"hangwatch: {none_found_text(empty)}", file=sys.stderr)
                        nothing = True
                        break
                stop.wait(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        watcher.close()
        for node in nodes:
            node.close()
    if nothing and watcher.failed is None:
        return Exit.USAGE
    return outcome(hung.is_set() or alone.is_set() or failed, watcher.failed)


def over_text(ended) -> str:
    """The end of the run, in words (runs.Over's fields)."""
    from ddp_preflight.hangwatch.who import label
    if ended.finished:
        return f"finished: {'all ' if len(ended.ranks) > 1 else ''}{len(ended.ranks)} " \
               f"rank{'s' if len(ended.ranks) > 1 else ''} exited 0"
    parts = []
    if ended.failed:
        parts.append(f"{', '.join(label(w) for w in ended.failed)} did not exit 0")
    if ended.unknown:
        parts.append(f"the exit of {', '.join(label(w) for w in ended.unknown)} was collected by its parent "
                     "before it could be read")
    if ended.alone:
        parts.append(f"{', '.join(label(w) for w in ended.alone)} never had a connection to a store or a peer: "
                     "each trained alone, in no process group (its WORLD_SIZE is more than 1)")
    return f"the run is over: its {len(ended.ranks)} ranks have ended; " + "; ".join(parts)


def over_data(ended) -> dict:
    from dataclasses import asdict

    def who_json(who):
        return who if isinstance(who, int) else asdict(who)
    return {"finished": ended.finished, "ranks": [who_json(w) for w in ended.ranks],
            "failed": [who_json(w) for w in ended.failed], "unknown": [who_json(w) for w in ended.unknown],
            "alone": [who_json(w) for w in ended.alone]}


def none_found_text(nodes: tuple[str, ...]) -> str:
    from ddp_preflight.hangwatch.runs import FIRST_SCANS
    return (f"no rank found on {', '.join(nodes)}: no process with RANK and WORLD_SIZE in its environment and no "
            f"torchrun, in {FIRST_SCANS} scans of every process of each; start the training first, give a "
            "rank's process with --pid HOST:PID, or --keep-watching to wait for one")


def outcome(hang_named: bool, failed: str | None) -> Exit:
    """The exit code: the watch's own crash is 2 (usage or internal error: a hang may have gone
    unnamed), never 1, which says a hang was named; else 1 or 0."""
    if failed is not None:
        from ddp_preflight.node.terminal import shown  # it may quote a node's words: shown, never obeyed
        print(f"hangwatch: internal error in the watch: {shown(failed)} (please report it)", file=sys.stderr)
        return Exit.USAGE
    return Exit.FOUND if hang_named else Exit.OK


if __name__ == "__main__":
    sys.exit(main())
