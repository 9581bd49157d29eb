"""The dashboard: pulls snapshots from a Source in a worker thread and shows them.

The UI thread only renders. Everything that asks the source (a snapshot, a stack dump, a
bundle, a log) runs in a thread worker, which posts what it got back as a message."""

from __future__ import annotations

from collections.abc import Callable

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.message import Message
from textual.widgets import Footer
from textual.worker import Worker, get_current_worker

from ddp_preflight.hangwatch.model import Snapshot, Who
from ddp_preflight.hangwatch.source import Source
from ddp_preflight.hangwatch.stacks import stacks_view
from ddp_preflight.node.terminal import shown

from .screens import KeysScreen, LogScreen, QuitScreen, StackScreen, StacksScreen
from .widgets import ClusterHeader, DiagnosisPanel, PreflightPanel, RanksTable


class SnapshotTaken(Message):
    def __init__(self, snapshot: Snapshot):
        super().__init__()
        self.snapshot = snapshot


class SnapshotFailed(Message):
    def __init__(self, reason: str):
        super().__init__()
        self.reason = reason


class DashboardApp(App[str]):
    """Returns "stop" when the user asked to stop the training it launched, else "leave"."""

    TITLE = "ddp-preflight"
    ENABLE_COMMAND_PALETTE = False
    # Below 30 rows (an 80x24 SSH terminal) the panels shrink so the ranks keep room.
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-tall")]
    CSS = """
    * { scrollbar-size-vertical: 1; }
    .-short DiagnosisPanel { max-height: 7; }
    .-short PreflightPanel { height: 6; }
    """
    BINDINGS = [
        Binding("s", "stack", "stack"),
        Binding("g", "stacks", "stacks"),
        Binding("l", "log", "log"),
        Binding("d", "dump", "dump"),
        Binding("b", "bundle", "bundle"),
        Binding("a", "all_checks", "checks"),
        Binding("q", "quit_dashboard", "quit"),
        Binding("question_mark", "keys", "keys", key_display="?"),
    ]
    # What `?` lists, in the user's words (the footer's labels are short).
    KEYS = [("s", "the chosen rank's whole Python stack"), ("g", "every rank's stack, grouped; the odd ones marked"),
            ("l", "the chosen rank's last output lines"), ("d", "take every rank's stack now"),
            ("b", "write an incident bundle now"), ("a", "every preflight check, or only the problems"),
            ("q", "quit (after a launch: asks whether to stop the training)"), ("?", "this list")]

    def __init__(self, source: Source, refresh: float = 1.0):   # refresh in seconds
        super().__init__()
        self.source = source
        self.refresh_seconds = refresh
        self.snapshot: Snapshot | None = None
        self.applied = 0              # snapshots shown so far: tests and the bench wait on it
        self._pulling: Worker | None = None
        self._guilty: list[Who] = []
        self._failing = False

    def compose(self) -> ComposeResult:
        yield ClusterHeader("waiting for the first snapshot…")
        yield DiagnosisPanel()
        yield RanksTable(id="ranks")
        yield PreflightPanel(classes="-empty")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(RanksTable).focus()
        self.pull()
        self.set_interval(self.refresh_seconds, self.tick)

    def tick(self) -> None:
        # A source slower than the refresh gets to finish: a new pull would cancel it and,
        # tick after tick, nothing would ever be shown.
        if self._pulling is None or self._pulling.is_finished:
            self.pull()

    def pull(self) -> None:
        self._pulling = self.take_snapshot()

    @work(thread=True, exclusive=True, exit_on_error=False, group="snapshot")
    def take_snapshot(self) -> None:
        try:
            snapshot = self.source.snapshot()
        except Exception as exc:             # the watcher's trouble is shown, not a traceback
            self.post_message(SnapshotFailed(f"{type(exc).__name__}: {exc}"))
            return
        if not get_current_worker().is_cancelled:
            self.post_message(SnapshotTaken(snapshot))

    def on_snapshot_taken(self, message: SnapshotTaken) -> None:
        try:
            header = self.query_one(ClusterHeader)
        except NoMatches:                    # a snapshot that arrives as the app closes: its widgets are gone
            return
        snapshot = self.snapshot = message.snapshot
        self._failing = False
        header.show(snapshot)
        self.query_one(DiagnosisPanel).show(snapshot)
        ranks = self.query_one(RanksTable)
        ranks.show(snapshot)
        self.query_one(PreflightPanel).show(snapshot.preflight)
        guilty = list(snapshot.diagnosis.named) if snapshot.diagnosis else []
        if guilty and guilty != self._guilty:
            ranks.point_at(guilty[0])          # a new diagnosis: `s` shows the guilty rank at once
        self._guilty = guilty
        if isinstance(self.screen, StacksScreen):     # `g` is open: it follows the run too
            self.screen.show(stacks_view(snapshot.ranks, snapshot.diagnosis))
        self.applied += 1

    def on_snapshot_failed(self, message: SnapshotFailed) -> None:
        if not self._failing:                # once per outage, not once per second
            self.notify(shown(f"could not read the run: {message.reason}"), severity="error", markup=False)
        self._failing = True

    # --- bindings --------------------------------------------------------------------------

    def _selected_rank(self):
        rank = self.query_one(RanksTable).selected()
        if rank is None:
            self.notify("no rank selected", severity="warning")
        return rank

    def action_stack(self) -> None:
        rank = self._selected_rank()
        if rank:
            self.push_screen(StackScreen(rank))

    def action_stacks(self) -> None:
        if self.snapshot is None:
            self.notify("no snapshot yet", severity="warning")
            return
        self.push_screen(StacksScreen(stacks_view(self.snapshot.ranks, self.snapshot.diagnosis)))

    def action_log(self) -> None:
        rank = self._selected_rank()
        if rank:
            self.push_screen(LogScreen(self.source, rank))

    def action_dump(self) -> None:
        self.dump_stacks()

    @work(thread=True, exit_on_error=False, group="dump")
    def dump_stacks(self) -> None:
        try:
            self.source.dump_stacks()
        except Exception as exc:
            self.call_from_thread(self.notify, shown(f"could not take the stacks: {exc}"), severity="error",
                                  markup=False)
            return
        self.call_from_thread(self.notify, "taking every rank's stack: the next refresh shows them")

    def action_bundle(self) -> None:
        self.write_bundle()

    @work(thread=True, exit_on_error=False, group="bundle")
    def write_bundle(self) -> None:
        try:
            path = self.source.write_bundle()
        except Exception as exc:
            self.call_from_thread(self.notify, shown(f"could not write the bundle: {exc}"), severity="error",
                                  markup=False)
            return
        if path:
            self.call_from_thread(self.notify, shown(f"bundle written: {path}"), timeout=10, markup=False)
        else:
            self.call_from_thread(self.notify, "no bundle written: this source cannot write one",
                                  severity="warning")

    def action_keys(self) -> None:
        self.push_screen(KeysScreen(self.KEYS))

    def action_all_checks(self) -> None:
        self.query_one(PreflightPanel).toggle_all()

    def action_quit_dashboard(self) -> None:
        if not self.source.launched:
            self.exit("leave")
            return
        self.push_screen(QuitScreen(), self._quit_chosen)

    def _quit_chosen(self, choice: str | None) -> None:
        if choice is None:
            return
        if choice == "stop":
            self.source.stop()               # returns at once; the launcher's threads stop the nodes
        self.exit(choice)


def run_dashboard(source: Source, refresh: float = 1.0, started: Callable[[App], None] | None = None) -> str:
    """Show the dashboard until the user quits: "stop" if they chose to stop the training the
    source launched (it is stopping), "leave" otherwise; or whatever the caller ends it with
    through the app `started` is given (app.exit("signal") on a SIGHUP: the app ends as on a quit,
    its input thread stopped and the terminal given back, never interrupted mid-loop)."""
    app = DashboardApp(source, refresh)
    if started is not None:
        started(app)
    return app.run() or "leave"
