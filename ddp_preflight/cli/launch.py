"""`ddp-preflight HOST ... --launch -- SCRIPT [ARGS]`, after the report: refuse or launch, print
every rank's lines, stop everything on Ctrl-C (or SIGTERM/SIGHUP) and print how each rank ended.
The only module of the launch that prints: rank output on stdout, the launcher's own on stderr."""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
import time
from pathlib import Path

from ddp_preflight.hangwatch.events import Event, EventKind
from ddp_preflight.launch.in_ranks import InRanks
from ddp_preflight.launch.outcome import render
from ddp_preflight.launch.plan import Command, PlanError, build_plan
from ddp_preflight.launch.run import Launch
from ddp_preflight.launch.watched import STOP_WAIT, WatchedLaunch, preflight_notes
from ddp_preflight.node.private import hold, why_refused
from ddp_preflight.node.redact import redact_argv, redact_env, redact_text
from ddp_preflight.node.terminal import shown, shown_text
from ddp_preflight.preflight.api import Preflight
from ddp_preflight.preflight.checks import CHECKS, run_checks
from ddp_preflight.preflight.model import Context, Report, Status
from ddp_preflight.rules.facts import Missing
from ddp_preflight.rules.launch_args import too_many_ranks

from .exit import Exit

RUNS = Path("ddp-preflight-runs")    # where each run's log folder goes without --log-dir
# What hangwatch says that the launcher relays (its rank-found and rank-gone lines are the ranks' own business).
SAID = (EventKind.DIAGNOSIS, EventKind.STRAGGLER, EventKind.INCIDENT, EventKind.NOTICE, EventKind.NODE,
        EventKind.RESUMED)
SIGNAL_REASONS = {signal.SIGINT: "interrupted (Ctrl-C)", signal.SIGTERM: "SIGTERM on the master",
                  signal.SIGHUP: "the master's terminal closed (SIGHUP)"}


def say(text: str) -> None:
    """One line of the launcher's own: what it quotes of a node or a rank (a preflight summary, a
    hangwatch verdict, an error) is shown, never obeyed (node/terminal.py), and its secrets out."""
    print(f"ddp-preflight: {shown(redact_text(text))}", file=sys.stderr, flush=True)


def refusal(report: Report, strict: bool) -> list:
    worst = 1 if strict else 2
    return [r for r in report.results if r.status.severity >= worst]


def describe(results: list) -> str:
    named = [f"{r.check}" + (f" on {r.node}" if r.node else "") + (" (warning, --strict)" if r.status is Status.WARN else "")
             for r in results]
    first = results[0]
    more = f"; also {', '.join(named[1:])}" if len(named) > 1 else ""
    return f"{named[0]} failed: {first.summary}{more}"


def default_log_dir() -> Path:
    base = RUNS / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    folder, n = base, 1
    while folder.exists():
        n += 1
        folder = base.with_name(f"{base.name}-{n}")
    return folder


def log_dir_problem(log_dir: str | None) -> str | None:
    """Why the run's logs could not be written where they would go, as one line with the fix;
    None when they can. Asked before any node is contacted."""
    folder = Path(log_dir) if log_dir else RUNS
    # A link or a folder another user could change on the way (node/private.py): refused, never followed.
    refused = why_refused(folder if log_dir else default_log_dir())
    if refused is not None:
        fix = "give --log-dir a folder" if log_dir else "run from a folder, or give --log-dir a folder,"
        return f"cannot write the logs in {folder}: {refused}: {fix} that no other user can change"
    existing = folder
    try:
        while not existing.exists():     # the folder the missing ones would be created in
            existing = existing.parent
        if not existing.is_dir():
            why = f"{existing} is not a folder"
        elif os.access(existing, os.W_OK | os.X_OK):
            _try_making(folder, existing)    # root may write anywhere, but not in /proc or /sys
            return None
        else:
            why = os.strerror(errno.EROFS if os.statvfs(existing).f_flag & os.ST_RDONLY else errno.EACCES)
    except OSError as exc:               # a folder on the way this user may not enter
        why = exc.strerror or str(exc)
    if log_dir:
        return f"cannot write the logs in {folder} ({why}): give --log-dir a folder this user can write to"
    return f"cannot write the logs in {folder}/ ({why}): run from a folder you can write to, or give --log-dir DIR"


def _try_making(folder: Path, existing: Path) -> None:
    """Make the folders missing between `existing` and `folder`, then remove them again: nothing is
    left behind when preflight then refuses the launch. OSError when they cannot be made."""
    made: list[Path] = []
    try:
        for part in reversed([folder, *folder.parents]):
            if part != existing and existing in part.parents and not part.exists():
                try:
                    part.mkdir()
                except FileExistsError:      # another launch from here made it meanwhile
                    continue
                made.append(part)
    finally:
        for part in reversed(made):
            try:
                part.rmdir()
            except OSError:                  # another launch from here writes in it already
                break


PLAN_CHECKS = ("interface-choice", "omp-threads")    # the results the plan reads (launch/plan.py), from facts alone


def in_ranks_for(args, cluster, targets, command: Command) -> InRanks:
    """Under --launch with probes: preflight's torch probes in the training's own ranks, which
    then wait for launch_training's word (launch/in_ranks.py). The plan it starts is the one
    launch_training builds, from the results the plan reads (facts alone); where the final one
    differs, that launch is stopped and the training started anew."""
    def plan_for(nodes, options):
        cpus = {n.node: None if isinstance(n.parsed.cpu, Missing) else n.parsed.cpu.usable_cores or n.parsed.cpu.logical_cores
                for n in nodes if n.error is None}
        if too_many_ranks(options.nproc_per_node, cpus):
            return None
        ctx = Context(nodes, options, {}, cluster.slurm_job)
        report = Report(tuple(run_checks(ctx, [c for c in CHECKS if c.id in PLAN_CHECKS])), tuple(n.node for n in nodes))
        try:
            return build_plan(report, nodes, options, targets, command, cwd=os.getcwd(),
                              flight_recorder=not args.no_flight_recorder)
        except PlanError:
            return None
    return InRanks(cluster, plan_for, lease=args.node_lease)


def launch_training(args, cluster, done: Preflight, targets, command: Command, in_ranks: InRanks | None = None) -> int:
    """`in_ranks`: the launch preflight's probes started, its ranks waiting for the word: given
    it when READY with the same plan; else stopped, no line of the training run."""
    try:
        return _launch_training(args, cluster, done, targets, command, in_ranks)
    finally:
        if in_ranks is not None:
            in_ranks.refuse()


def _launch_training(args, cluster, done: Preflight, targets, command: Command, in_ranks: InRanks | None) -> int:
    report = done.report
    cpus = {n.node: None if isinstance(n.parsed.cpu, Missing) else n.parsed.cpu.usable_cores or n.parsed.cpu.logical_cores
            for n in done.nodes if n.error is None}
    over = too_many_ranks(done.options.nproc_per_node, cpus)
    if over:
        say(f"not launching: {over}")
        return Exit.FOUND
    bad = refusal(report, args.strict)
    if bad and not args.force:
        say(f"not launching: {describe(bad)}. Fix it (the report above has the fix), "
            "or add --force to launch anyway")
        return Exit.FOUND
    if bad:
        say(f"launching anyway (--force), though {describe(bad)}")
    try:
        # The training's variables (--env, the config's) are in the options: each node gets its own.
        plan = build_plan(report, done.nodes, done.options, targets, command, cwd=os.getcwd(),
                          flight_recorder=not args.no_flight_recorder)
    except PlanError as exc:
        say(f"cannot launch: {exc}")
        return Exit.FOUND
    log_dir = Path(args.log_dir) if args.log_dir else default_log_dir()
    try:
        hold(log_dir)       # open for the run: its files and incidents/ are written relative to it
    except OSError as exc:
        say(f"cannot create the log folder {log_dir}: {exc.strerror} (choose another with --log-dir)")
        return Exit.USAGE

    counts = [len(n.ranks) for n in plan.nodes]
    each = f"{len(plan.nodes)} node(s) x {counts[0]}" if len(set(counts)) == 1 else "+".join(map(str, counts))
    say(f"launching {' '.join(redact_argv(command.words()))} on {each} "
        f"= {plan.world_size} ranks; master {plan.master_addr}:{plan.master_port}; logs in {log_dir}/")
    for node in plan.nodes:
        env = " ".join(f"{k}={v}" for k, v in redact_env(dict(node.env)).items()) or "no extra environment"
        say(f"  {node.node}: node rank {node.node_rank}, ranks {node.ranks[0]}-{node.ranks[-1]}, {env}")

    out = threading.Lock()
    dashboard = {"on": bool(args.tui)}     # while it is up, lines go to the logs and the dashboard only

    def show(line) -> None:
        if dashboard["on"]:
            return
        with out:
            sys.stdout.write(line.shown() + "\n")
            sys.stdout.flush()

    def logs_failed(why: str) -> None:
        # The summary says it too (the logs are incomplete), also after the dashboard.
        if not dashboard["on"]:
            say(f"cannot write the logs in {log_dir} ({why}): logging stopped; the output goes on here")

    def on_event(event: Event) -> None:
        if dashboard["on"] or event.kind not in SAID:
            return
        if event.kind is EventKind.NODE and event.data.get("status") == "watching" and not event.data.get("again"):
            return
        say(f"hangwatch: {event.text}")

    run = WatchedLaunch(cluster, plan, log_dir, lease=args.node_lease, stop_on_hang=args.stop_on_hang,
                        endless_after=args.endless_after, notes=preflight_notes(report), on_event=on_event,
                        gate=in_ranks.ready(plan) if in_ranks is not None else None)
    launch = run.launch
    launch.on_line.append(show)
    launch.on_logs_failed.append(logs_failed)
    caught: list[int] = []
    apps: list = []           # the dashboard, while it is up

    def on_signal(signum, frame):
        caught.append(signum)
        if signum == signal.SIGHUP:
            _terminal_gone()
        if dashboard["on"] and apps:
            # Ended as a quit ends it (its input thread stopped, the terminal given back), then
            # stopped as below: a KeyboardInterrupt raised inside its loop left that thread reading
            # a hung-up terminal for ever, at full CPU, and the process never exited.
            apps[-1].exit("signal")
            return
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, on_signal) for s in SIGNAL_REASONS}
    result = None
    try:
        try:
            run.start()
            if args.tui:
                from ddp_preflight.hangwatch.launched import LaunchedRun
                from ddp_preflight.tui.app import run_dashboard

                choice = run_dashboard(LaunchedRun(run.watcher, launch, report.to_json()), started=apps.append)
                dashboard["on"] = False
                if choice == "signal":
                    raise KeyboardInterrupt
                if choice == "stop":
                    say("stopping every node: quit from the dashboard")
                    run.stop("quit from the dashboard")
                elif run.wait(0) is None:
                    say("the dashboard closed; the training goes on and its output follows (Ctrl-C stops it)")
            while run.wait(0.25) is None:
                pass
        except KeyboardInterrupt:
            reason = SIGNAL_REASONS.get(signal.Signals(caught[-1]) if caught else signal.SIGINT, "interrupted")
            say(f"stopping every node: {reason}")
            run.stop(reason)
        result = _wait_for_stop(launch)
    finally:
        run.conclude(result)          # hangwatch judges the order the ranks left in: the run's verdict
        for s, handler in previous.items():
            signal.signal(s, handler)
    if result is None:
        late = [n.node for n in launch.nodes.values() if n.ended_at is None]
        say(f"{', '.join(late)} did not confirm the stop within {STOP_WAIT:.0f} s (unreachable?); a node that "
            f"does not hear from this machine stops its part by itself within its {launch.lease:g} s lease")
        return Exit.FOUND
    sys.stderr.write("ddp-preflight: " + shown_text(redact_text(render(result, plan.master_port, plan.nodes[0].node))))
    sys.stderr.flush()
    return result.exit_code


def _terminal_gone() -> None:
    """The terminal hung up: what the launcher still says goes nowhere instead of failing (a write
    to a hung-up terminal raises EIO, which would end the launcher before it stops the nodes and
    writes result.json, where the run's end is kept)."""
    try:
        null = os.open(os.devnull, os.O_RDWR)
    except OSError:
        return
    for fd in (0, 1, 2):
        try:
            os.dup2(null, fd)
        except OSError:
            pass
    os.close(null)


def _wait_for_stop(launch: Launch):
    """The result, waiting through further Ctrl-C presses: the stop is already under way."""
    deadline = time.monotonic() + STOP_WAIT
    while time.monotonic() < deadline:
        try:
            result = launch.wait(0.25)
            if result is not None:
                return result
        except KeyboardInterrupt:
            say("still stopping; every node's process group ends within seconds")
    return None
