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

from launch.outcome import render
from launch.plan import Command, PlanError, build_plan
from launch.run import Launch
from node.private import hold, why_refused
from node.redact import redact_argv, redact_env, redact_text
from node.terminal import shown, shown_text
from preflight.api import Preflight
from preflight.model import Report, Status

from .exit import Exit

RUNS = Path("ddp-preflight-runs")    # where each run's log folder goes without --log-dir
STOP_WAIT = 30.0      # seconds for every node to confirm the stop (the freeze, up to 8 s; the supervisors' grace, 5 s)
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
            return None
        else:
            why = os.strerror(errno.EROFS if os.statvfs(existing).f_flag & os.ST_RDONLY else errno.EACCES)
    except OSError as exc:               # a folder on the way this user may not enter
        why = exc.strerror or str(exc)
    if log_dir:
        return f"cannot write the logs in {folder} ({why}): give --log-dir a folder this user can write to"
    return f"cannot write the logs in {folder}/ ({why}): run from a folder you can write to, or give --log-dir DIR"


def launch_training(args, cluster, done: Preflight, targets, command: Command) -> int:
    report = done.report
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

    say(f"launching {' '.join(redact_argv(command.words()))} on {len(plan.nodes)} node(s) x {plan.nproc_per_node} "
        f"= {plan.world_size} ranks; master {plan.master_addr}:{plan.master_port}; logs in {log_dir}/")
    for node in plan.nodes:
        env = " ".join(f"{k}={v}" for k, v in redact_env(dict(node.env)).items()) or "no extra environment"
        say(f"  {node.node}: node rank {node.node_rank}, ranks {node.ranks[0]}-{node.ranks[-1]}, {env}")

    launch = Launch(cluster, plan, log_dir, **({"lease": args.node_lease} if args.node_lease else {}))
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

    launch.on_line.append(show)
    launch.on_logs_failed.append(logs_failed)
    watcher = watch(cluster, launch, log_dir, lambda: dashboard["on"], stop_on_hang=args.stop_on_hang,
                    endless_after=args.endless_after, notes=preflight_notes(report))
    caught: list[int] = []

    def on_signal(signum, frame):
        caught.append(signum)
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, on_signal) for s in SIGNAL_REASONS}
    try:
        try:
            launch.start()
            watcher.start()
            if args.tui:
                from hangwatch.launched import LaunchedRun
                from tui.app import run_dashboard

                choice = run_dashboard(LaunchedRun(watcher, launch, report.to_json()))
                dashboard["on"] = False
                if choice == "stop":
                    say("stopping every node: quit from the dashboard")
                    launch.stop("quit from the dashboard")
                elif launch.wait(0) is None:
                    say("the dashboard closed; the training goes on and its output follows (Ctrl-C stops it)")
            while launch.wait(0.25) is None:
                pass
        except KeyboardInterrupt:
            reason = SIGNAL_REASONS.get(signal.Signals(caught[-1]) if caught else signal.SIGINT, "interrupted")
            say(f"stopping every node: {reason}")
            launch.stop(reason)
        result = _wait_for_stop(launch)
        if result is not None and not result.ok:
            watcher.settle()          # hangwatch judges the order the ranks left in
    finally:
        watcher.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    if result is None:
        late = [n.node for n in launch.nodes.values() if n.ended_at is None]
        say(f"{', '.join(late)} did not confirm the stop within {STOP_WAIT:.0f} s (unreachable?); a node that "
            f"does not hear from this machine stops its part by itself within its {launch.lease:g} s lease")
        return Exit.FOUND
    if not result.ok:
        launch.add_verdict(watcher.verdict())      # who failed first, and why: hangwatch's verdict on the ends
    sys.stderr.write("ddp-preflight: " + shown_text(redact_text(render(result, plan.master_port, plan.nodes[0].node))))
    sys.stderr.flush()
    return result.exit_code


def preflight_notes(report: Report) -> dict[str, tuple[str, ...]]:
    """What preflight found wrong on each node, for hangwatch to quote beside a hang there (a
    loader that never ends, on the node with the fewer shards)."""
    notes: dict[str, list[str]] = {}
    for r in report.results:
        if r.node and r.status in (Status.WARN, Status.FAIL):
            notes.setdefault(r.node, []).append(f"{r.check}: {r.summary}")
    return {node: tuple(said) for node, said in notes.items()}


def watch(cluster, launch: Launch, log_dir: Path, quiet, stop_on_hang: bool = False, endless_after=None,
          notes=None):
    """hangwatch on every node the run started on, over the same connections; what it names is
    said here (and kept in the log folder's incidents/). What the launcher learns of how ranks end
    (the launchers' stops, the exceptions in their output, torchrun's exit codes) is its evidence too."""
    from hangwatch.watch import Watcher, WatchTarget

    targets = [WatchTarget(cluster.nodes[i]) for i in cluster.usable()]

    def on_hang(path: str) -> None:
        if stop_on_hang:
            launch.stop(f"hangwatch named a hang (--stop-on-hang); bundle {path}")

    def on_event(event) -> None:
        _note_alone(launch, event)
        if quiet() or event.kind not in ("diagnosis", "straggler", "incident", "notice", "node", "resumed"):
            return
        if event.kind == "node" and event.data.get("status") == "watching" and not event.data.get("again"):
            return
        say(f"hangwatch: {event.text}")

    # The agents go with the run: a node cut off from this machine ends both within one lease.
    watcher = Watcher(targets, on_event=on_event, on_hang=on_hang, incident_dir=str(log_dir / "incidents"),
                      lease=launch.lease, endless_after=endless_after, notes=notes,
                      planned={r.rank: r.node for r in launch.ranks.values()})
    launch.on_stopping.append(watcher.launcher_stopping)
    launch.on_exception.append(watcher.rank_error)
    launch.on_rank_end.append(watcher.rank_ended)
    return watcher


def _note_alone(launch: Launch, event) -> None:
    """The summary repeats that the ranks never connected: the run may say "training finished"."""
    if "alone" in event.data:
        launch.note("alone", f"but the ranks never exchanged a byte: {event.text}" if event.data["alone"] else None)


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
