"""Modal views over the dashboard: a rank's stack, every rank's stack grouped, a rank's log, and the
question on quit."""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ddp_preflight.hangwatch.ended_text import joined
from ddp_preflight.hangwatch.model import RankView
from ddp_preflight.hangwatch.source import Source
from ddp_preflight.hangwatch.stacks import StacksView
from ddp_preflight.hangwatch.words import ranks_of
from ddp_preflight.node.terminal import shown, visible

from . import format as fmt

MODAL_CSS = """
{name} {{ align: center middle; }}
{name} > Vertical {{ width: 90%; max-width: 120; height: auto; max-height: 90%;
    border: round $primary; background: $surface; padding: 0 1; }}
{name} VerticalScroll {{ height: auto; max-height: 100%; }}
"""


class KeysScreen(ModalScreen[None]):
    """What each key does (`?`): the dashboard's KEYS, which a test holds to its bindings."""

    DEFAULT_CSS = MODAL_CSS.format(name="KeysScreen")
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close")]

    def __init__(self, keys: list[tuple[str, str]]):
        super().__init__()
        self.keys = keys

    def compose(self) -> ComposeResult:
        width = max(len(key) for key, _ in self.keys)
        text = Text()
        for key, what in self.keys:
            text.append(f"{key:>{width}}", "bold")
            text.append(f"  {what}\n")
        text.append(f"{'↑ ↓':>{width}}", "bold")
        text.append("  choose a rank (s and l show the chosen one)")
        with Vertical() as box:
            box.border_title = "keys"
            box.border_subtitle = "esc closes"
            yield Static(text, id="keys")


class StackScreen(ModalScreen[None]):
    """The rank's whole Python stack from the last snapshot, innermost frame first."""

    DEFAULT_CSS = MODAL_CSS.format(name="StackScreen")
    BINDINGS = [Binding("escape,q,s", "dismiss", "close")]

    def __init__(self, rank: RankView):
        super().__init__()
        self.rank = rank

    def compose(self) -> ComposeResult:
        rank = self.rank
        with Vertical() as box:
            box.border_title = Text(shown(f"{rank.label} on {rank.node} (PID {rank.pid}): {fmt.state_label(rank)}"))
            box.border_subtitle = "innermost first · esc closes"
            with VerticalScroll():
                yield Static(render_stack(rank), id="stack")


def render_stack(rank: RankView) -> Text:
    if rank.stack is None:
        return Text("no stack yet: press d to take every rank's stack now")
    if not rank.stack:
        return Text("the stack was empty (the process is between Python frames)")
    text = Text()
    for line in fmt.stack_lines(rank.stack):
        # The training code's own line stands out from torch's frames around it.
        text.append(shown(line) + "\n", "bold" if line.startswith(f"{rank.frame}  ") else "")
    text.rstrip()
    return text


class StacksScreen(ModalScreen[None]):
    """Every rank's stack from the last snapshot, ranks with the same stack as one group (the
    largest first), the groups that differ from it marked `!`; above them, when a hang is named
    and the Flight Recorder's numbers are known, the ranks lined up by sequence number."""

    DEFAULT_CSS = MODAL_CSS.format(name="StacksScreen")
    BINDINGS = [Binding("escape,q,g", "dismiss", "close")]

    def __init__(self, view: StacksView):
        super().__init__()
        self.view = view

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = _stacks_title(self.view)
            box.border_subtitle = "innermost first · ! differs from the most ranks · esc closes"
            with VerticalScroll():
                yield Static(render_groups(self.view), id="stacks")

    def show(self, view: StacksView) -> None:
        """A newer snapshot while it is open: its stacks, not the ones of the moment `g` was pressed."""
        if view == self.view:
            return
        self.view = view
        self.query_one(Vertical).border_title = _stacks_title(view)
        self.query_one("#stacks", Static).update(render_groups(view))


def _stacks_title(view: StacksView) -> str:
    stacks = sum(1 for g in view.groups if g.stack is not None)
    return (f"every rank's stack: {view.ranks} rank{'s' if view.ranks != 1 else ''}, "
            f"{stacks} different stack{'s' if stacks != 1 else ''}")


def render_groups(view: StacksView) -> Text:
    text = Text()
    if view.joined is not None:
        text.append("Flight Recorder: ", "bold")
        text.append(shown(joined(view.joined)) + "\n\n")
    if not view.groups:
        text.append("no ranks yet")
    for group in view.groups:
        count = f"{len(group.ranks)} rank{'s' if len(group.ranks) != 1 else ''}"
        who = ranks_of(group.ranks)
        if group.stack is None:
            text.append(f"  {shown(who)} ({count}): no stack yet, press d to take every rank's stack now\n\n")
            continue
        if group.differs:
            text.append(f"! {shown(who)} ({count}): differs\n", "bold")
        else:
            text.append(f"  {shown(who)} ({count})\n", "bold")
        lines = fmt.stack_lines(group.stack) or ["(empty: the process is between Python frames)"]
        text.append("".join(f"    {shown(line)}\n" for line in lines) + "\n")
    text.rstrip()
    return text


class LogScreen(ModalScreen[None]):
    """The rank's last output lines, read from the source in a worker (over SSH, for a
    remote node)."""

    DEFAULT_CSS = MODAL_CSS.format(name="LogScreen")
    BINDINGS = [Binding("escape,q,l", "dismiss", "close")]

    def __init__(self, source: Source, rank: RankView):
        super().__init__()
        self.source, self.rank = source, rank

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = Text(shown(f"output of {self.rank.label} on {self.rank.node}"))
            box.border_subtitle = "esc closes"
            with VerticalScroll():
                yield Static("reading…", id="log")

    def on_mount(self) -> None:
        self.read()

    @work(thread=True, exclusive=True, exit_on_error=False)
    def read(self) -> None:
        try:
            lines = self.source.log(self.rank.node, self.rank.rank)
            # The rank's own text: its escape sequences are shown, never sent to the terminal.
            text = Text("\n".join(map(visible, lines))) if lines else Text("no output from this rank yet")
        except Exception as exc:            # the log is a nicety: say why, keep the dashboard
            text = Text(shown(f"could not read the log: {exc}"))
        self.app.call_from_thread(self._show, text)

    def _show(self, text: Text) -> None:
        self.query_one("#log", Static).update(text)
        self.query_one(VerticalScroll).scroll_end(animate=False)


class QuitScreen(ModalScreen[str | None]):
    """Asked on quit when the dashboard launched the training: stop it or leave it running."""

    DEFAULT_CSS = MODAL_CSS.format(name="QuitScreen") + """
    QuitScreen > Vertical { width: auto; max-width: 70; }
    QuitScreen Static { width: auto; }
    """
    BINDINGS = [Binding("y", "choose('stop')", "yes, stop it"),
                Binding("n", "choose('leave')", "no, leave it running"),
                Binding("escape", "choose(None)", "cancel")]

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "quit"
            yield Static("Stop the training on every node?\n[y]es / [n]o, leave it running / [esc] cancel",
                         markup=False)

    def action_choose(self, choice: str | None) -> None:
        self.dismiss(choice)
