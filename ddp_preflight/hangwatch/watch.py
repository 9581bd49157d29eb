"""The watcher on the master: an agent on every node, every rank merged into one view, a hang
named when progress stops. It is the dashboard's Source and feeds the CLI's event stream.

A thin shell around the reducer (reducer.py), which holds all the logic: the agents' reader
threads and a ticker (4 Hz) feed it inputs under one lock; what it returns is carried out here
(events said, stacks asked for, bundles written, py-spy brought to a node). Tests replay recorded
agent messages through `receive`, `closed` and `tick` on a clock they drive."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from ddp_preflight.node import protocol, pyspy
from ddp_preflight.transport import Node, NodeError

from . import alone, ended, reducer, runs, stall
from .events import Event
from .inputs import Effect, Input
from .links import LEASE, AgentLink
from .model import Diagnosis, NodeNote, Snapshot
from .render import event_text
from .source import Source
from .who import Who

COPY_WAIT = 30.0          # seconds the watch's end waits for a py-spy still being copied
BUNDLE_WAIT = 60.0        # seconds the watch's end waits for a bundle still being written
# A file that gets one line per input the reducer takes and what it returned (its time, the input,
# the agent's own time for its messages): how late a sample or a stack came, read after the fact.
TRACE_VARIABLE = "HANGWATCH_TRACE"


@dataclass(frozen=True)
class WatchTarget:
    node: Node                     # reached through the transport (SSH, or this machine)
    pids: tuple[int, ...] = ()     # processes to watch whatever they look like (and no other)
    run: str | None = None         # a launch's run token: its processes alone are watched (node/ranks.py)

    @property
    def name(self) -> str:
        return self.node.name


class Watcher(Source):
    def __init__(self, targets: list[WatchTarget], *, threshold: float = stall.DEFAULT_THRESHOLD,
                 interval: float = 1.0, native: bool = False, py_spy: str | None = None,
                 on_event: Callable[[Event], None] | None = None, on_hang: Callable[[str, bool], None] | None = None,
                 incident_dir: str = "hangwatch-incidents", lease: float = LEASE,
                 endless_after: float | None = None, notes: dict[str, tuple[NodeNote, ...]] | None = None,
                 planned: dict[int, str] | None = None, held_after: float = stall.HELD_BOUND,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time):
        self.clock, self.wall = clock, wall    # tests replaying recorded agent lines drive the clock
        self.targets, self.threshold, self.interval = list(targets), threshold, interval
        self.native, self.py_spy, self.lease = native, py_spy, lease
        self.on_event, self.on_hang = on_event or (lambda e: None), on_hang
        self.incident_dir = incident_dir
        # planned: rank -> node from a launch plan, to place a rank no agent found
        config = reducer.Config(threshold, interval, native, endless_after, dict(notes or {}), dict(planned or {}),
                                held_after)
        self.state = reducer.new_state([t.name for t in targets], config)
        self.lock = threading.RLock()
        self.links: dict[str, AgentLink] = {}
        self._bringing: list[threading.Thread] = []
        self._writing: list[threading.Thread] = []
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self.trace = _trace_file(os.environ.get(TRACE_VARIABLE))
        self.failed: str | None = None      # the watch's own first crash: its verdicts may be missing

    # --- life -----------------------------------------------------------------------------
    def start(self) -> Watcher:
        for target in self.targets:
            link = AgentLink(target.node, self.receive, self.closed)
            spec = {"node": target.name, "interval": self.interval, "pids": list(target.pids), "lease": self.lease,
                    "native": self.native, "py_spy": self.py_spy or (local_py_spy() if target.node.is_local else None),
                    **({"run": target.run} if target.run else {})}
            try:
                link.start(spec)
            except Exception as exc:
                self.feed(reducer.AgentFailed(target.name, f"{target.name}: the agent did not start with "
                                              f"{target.node.python}: {exc}; fix: --python PATH, the training "
                                              "environment's Python, runnable by this user"))
                continue
            self.links[target.name] = link
        return self.start_ticking()

    def start_ticking(self) -> Watcher:
        """Time passing, 4 Hz, on the real clock (start does it; a test that plays the agents'
        messages itself starts it alone)."""
        self._ticker = threading.Thread(target=self._tick_loop, name="hangwatch-tick", daemon=True)
        self._ticker.start()
        return self

    def settle(self, timeout: float = reducer.EXIT_SETTLE + ended.EXIT_WAIT + 1.0) -> None:
        """Wait (up to `timeout`) for exits still being judged: at the end of a run, the order in
        which its ranks left says which one to look at (judged once every rank's exit message came,
        ended.awaited: at once, unless one is late)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if self.state.exit_check_at is None:
                    return
            time.sleep(0.1)

    def close(self) -> None:
        self.feed(reducer.Stopping())
        self._stop.set()
        for link in self.links.values():
            link.close()
        if self._ticker:
            self._ticker.join(2)
        for thread in self._bringing:
            thread.join(COPY_WAIT)
        for thread in self._writing:
            thread.join(BUNDLE_WAIT)

    # --- inputs ---------------------------------------------------------------------------
    def receive(self, node: str, message: dict) -> None:
        """A message from a node's agent (the links' reader threads)."""
        try:
            typed = protocol.agent_message(message)
        except (TypeError, ValueError) as exc:      # one bad message is a notice; the node stays watched
            self.notice(f"hangwatch: a message from {node} could not be read: {type(exc).__name__}: {exc}")
            return
        if typed is not None:
            self.feed(reducer.FromAgent(node, typed))

    def closed(self, node: str, why: str | None) -> None:
        self.feed(reducer.AgentClosed(node, why))

    def tick(self) -> None:
        self.feed(reducer.Tick())

    def notice(self, text: str) -> None:
        self.feed(reducer.Notice(text))

    # --- what a launcher knows (ddp-preflight --launch) -------------------------------------
    def launcher_stopping(self, node: str | None, t: float, by: str) -> None:
        """A launcher began stopping ranks: torchrun on `node` (`t` on its clock), or ddp-preflight
        on every node (`node` None, `t` on this machine's clock)."""
        self.feed(reducer.LauncherStopping(node, t, by))

    def rank_error(self, node: str, rank: int, exception) -> None:
        """A launched rank printed an exception (ddp_preflight.hangwatch.tracebacks.ExceptionInfo)."""
        self.feed(reducer.RankError(node, rank, exception))

    def rank_stepped(self, node: str, rank: int, step: int) -> None:
        """A launched rank printed a new step line: progress."""
        self.feed(reducer.RankStepped(node, rank, step))

    def rank_ended(self, node: str, rank: int, pid: int | None, status: protocol.ExitStatus) -> None:
        """torchrun collected a launched rank's exit code or signal."""
        self.feed(reducer.RankEnded(node, rank, pid, status))

    def verdict(self) -> Diagnosis | None:
        """The verdict on the ranks' ends as it stands now (the run whose rank ended last), judged
        afresh from everything known; None when nothing failed."""
        with self.lock:
            return ended.judge(self.state, self.clock(), self.wall())

    def feed(self, event: Input) -> None:
        try:
            with self.lock:
                now, wall = self.clock(), self.wall()
                effects = reducer.step(self.state, event, now, wall)
                if self.trace is not None:
                    self._trace(event, now, wall, effects)
        except Exception as exc:      # the watch goes on; say it once
            self._failed(exc)
            with self.lock:
                effects = reducer.step(self.state, reducer.Notice(
                    f"hangwatch: internal error in the watch: {type(exc).__name__}: {exc}"), self.clock(), self.wall())
        for effect in effects:
            self._carry_out(effect)

    def _trace(self, event: Input, now: float, wall: float, effects: list[Effect]) -> None:
        message = getattr(event, "message", None)
        said = {"now": round(now, 3), "wall": round(wall, 3), "input": type(event).__name__,
                "node": getattr(event, "node", None), "message": type(message).__name__ if message else None,
                "t": getattr(message, "t", None), "id": getattr(message, "id", None),
                "effects": [type(e).__name__ for e in effects]}
        if said["input"] == "Tick" and not effects or self.trace is None:
            return
        try:
            self.trace.write(json.dumps(said) + "\n")
            self.trace.flush()
        except (OSError, ValueError):
            self.trace = None

    def _failed(self, exc: Exception) -> None:
        """The watch's own crash, remembered (the first): hangwatch then exits 2, never 0 or 1, since
        a hang may have gone unnamed."""
        if self.failed is None:
            self.failed = f"{type(exc).__name__}: {exc}"

    def _tick_loop(self) -> None:
        while not self._stop.wait(0.25):
            self.tick()

    # --- effects --------------------------------------------------------------------------
    def _carry_out(self, effect: Effect) -> None:
        if isinstance(effect, reducer.Say):
            self._say(effect.event)
        elif isinstance(effect, reducer.Send):
            link = self.links.get(effect.node)
            if link is not None:
                link.send(effect.command)
        elif isinstance(effect, reducer.AskStacks):
            for name in effect.nodes:
                link = self.links.get(name)
                if link is not None:
                    link.send(effect.command)     # a closed one: its close comes as an input
        elif isinstance(effect, reducer.WriteBundle):
            if self._ticker is None:      # a replay driving the clock: in place, in order
                self._write_bundle(effect)
            else:
                # Seconds at thousands of ranks (redacting, rendering): outside the decision loop,
                # so the ticks and the agents' messages go on meanwhile (issue 36).
                thread = threading.Thread(target=self._write_bundle, args=(effect,), name="hangwatch-bundle",
                                          daemon=True)
                self._writing.append(thread)
                thread.start()
        elif isinstance(effect, reducer.HangNamed):
            if self.on_hang:
                self.on_hang(effect.bundle, effect.certain)
        elif isinstance(effect, reducer.BringPySpy):
            # Copying takes seconds over a slow link: the node's messages keep coming meanwhile.
            thread = threading.Thread(target=self._bring_py_spy, args=(effect.node,), daemon=True)
            self._bringing.append(thread)
            thread.start()

    def _write_bundle(self, effect: reducer.WriteBundle) -> None:
        from .incident import write
        try:
            path = write(effect.snapshot, effect.details, self.incident_dir)
        except OSError as exc:
            self.feed(reducer.BundleFailed(str(exc)))
        else:
            self.feed(reducer.BundleWritten(path))

    def _say(self, event: Event) -> None:
        """An event to the listener, its line rendered here, at the edge, from what it carries."""
        try:
            self.on_event(replace(event, text=event_text(event)))
        except Exception as exc:      # the listener's own failure (a closed stdout): the watch goes on
            self._failed(exc)

    def _bring_py_spy(self, node: str) -> None:
        """py-spy is missing on a node: copy ours there (a static binary) for this watch, into a
        folder made for it now that only this user can write (the transport's put_file: a name
        another user could have placed first is never used); the agent removes it at its end."""
        target = next(t for t in self.targets if t.name == node)
        binary = local_py_spy()
        hello = self.state.hello.get(node)
        if target.node.is_local and hello is not None and hello.py_spy_refused:
            return      # the agent said which py-spy it refused and why: none is missing
        if target.node.is_local or binary is None:
            self.notice(f"{node}: py-spy is not installed for the training Python there, so stacks are "
                        "missing; fix: pip install py-spy in the training environment on that node (CPU "
                        "and /proc are still watched)")
            return
        try:
            path, folder = target.node.put_file(binary, "py-spy", mode=0o700, prefix="hangwatch-")
        except NodeError as exc:      # a full disk, a link gone: say it, watch without stacks
            self.notice(f"{exc.summary}; fix: pip install py-spy in the training environment on that node")
            return
        self.links[node].send({"cmd": "py-spy", "path": path, "remove": folder})
        self.notice(f"{node}: py-spy was missing; copied this machine's to {path} for this watch")

    # --- Source -----------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        with self.lock:
            return reducer.snapshot(self.state, self.wall())

    def dump_stacks(self) -> None:
        self.feed(reducer.TakeStacks())

    def write_bundle(self) -> str | None:
        """A bundle now, asked for by the user (the dashboard's b): no hang is named."""
        from .incident import write
        with self.lock:
            snap, details = reducer.snapshot(self.state, self.wall()), reducer.details(self.state)
        path = write(snap, details, self.incident_dir)
        self.feed(reducer.BundleAsked(path))
        return path

    def details(self) -> dict:
        with self.lock:
            return reducer.details(self.state)

    # --- attach: the end of what it followed ------------------------------------------------
    def over(self) -> runs.Over | None:
        """The run followed is over (runs.over): every rank ended and judged, its torchruns leaving."""
        with self.lock:
            return runs.over(self.state)

    def never_connected(self) -> tuple[Who, ...]:
        """The ranks that imported torch and never joined a process group (runs.never_connected)."""
        with self.lock:
            return runs.never_connected(self.state)

    def ran_no_collective(self) -> tuple[Who, ...]:
        """The ranks never connected whose own end record says they ran no collective."""
        with self.lock:
            return runs.ran_no_collective(self.state)

    def alone_verdict(self) -> Diagnosis | None:
        """The verdict on a run whose every rank exited 0, none connected and none ran a collective."""
        with self.lock:
            return alone.at_end(self.state, self.clock(), self.wall(), set(runs.ran_no_collective(self.state)))

    def none_found(self) -> tuple[str, ...]:
        """The watched nodes, when every one has been scanned a few times and nothing was found."""
        with self.lock:
            return runs.none_found(self.state)


def _trace_file(path: str | None):
    """The trace file, opened to append, created private, never through a link another user could
    have planted (O_NOFOLLOW); None when not asked for or it cannot be opened (the watch goes on)."""
    if not path:
        return None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    return os.fdopen(fd, "a", encoding="utf-8")


def local_py_spy() -> str | None:
    """This machine's py-spy, found and trusted by the one rule the agents use (node/pyspy.py):
    the copy brought to a node that lacks one is never a file another user could change."""
    return pyspy.find()[0]
