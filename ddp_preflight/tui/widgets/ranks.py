"""Every rank in one row: where it runs, its CPU, what it is doing and where, its progress."""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.coordinate import Coordinate
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey

from ddp_preflight.hangwatch.model import RankView, Snapshot, Who
from ddp_preflight.node.terminal import shown, visible

from .. import format as fmt

COLUMNS = (("rank", "rank"), ("node", "node"), ("pid", "PID"), ("cpu", "CPU"), ("state", "state"),
           ("frame", "frame"), ("steps", "steps"), ("output", "last output"))
STATE_STYLE = {"exited": "red", "unknown": "dim", "idle": "yellow"}
GUILTY_STYLE = "bold red"

Cell = tuple[str, str]      # text, style: compared to skip cells that did not change


class RanksTable(DataTable):
    """Updated in place, cell by cell, so a refresh of 64 ranks redraws only what changed and
    the cursor stays on the rank the user picked."""

    DEFAULT_CSS = """
    RanksTable { height: 1fr; min-height: 5; }
    """

    def __init__(self, **kwargs):
        super().__init__(cursor_type="row", zebra_stripes=False, **kwargs)
        self._cells: dict[str, list[Cell]] = {}
        self._ranks: dict[str, RankView] = {}

    def on_mount(self) -> None:
        for key, label in COLUMNS:
            self.add_column(label, key=key)

    def show(self, snapshot: Snapshot) -> None:
        guilty = set(snapshot.diagnosis.named) if snapshot.diagnosis else set()
        ranks = sorted(snapshot.ranks, key=lambda r: (r.rank is None, r.rank or 0, r.node, r.pid))
        rows = {row_key(r): cells(r, r.rank in guilty, snapshot.threshold) for r in ranks}
        if list(rows) != list(self._cells):
            self._rebuild(rows)
        else:
            for key, new in rows.items():
                for (column, _), old_cell, new_cell in zip(COLUMNS, self._cells[key], new, strict=True):
                    if old_cell != new_cell:
                        self._update(key, column, new_cell)
        self._cells = rows
        self._ranks = {row_key(r): r for r in ranks}

    def _update(self, key: str, column: str, cell: Cell) -> None:
        # Columns only grow: re-measuring a column that might shrink measures all its cells, for
        # every changed cell, and the columns would jitter as CPU figures come and go.
        wider = cell_len(cell[0]) > self.columns[ColumnKey(column)].content_width
        self.update_cell(key, column, Text(*cell), update_width=wider)

    def _rebuild(self, rows: dict[str, list[Cell]]) -> None:
        # Ranks came or went (a node joined, a process was found): the only time rows are
        # rebuilt. The cursor stays on the same rank when it is still there.
        selected = self.selected()
        self.clear()
        for key, row in rows.items():
            self.add_row(*(Text(*cell) for cell in row), key=key)
        if selected and row_key(selected) in rows:
            self.move_cursor(row=list(rows).index(row_key(selected)), scroll=False)

    def selected(self) -> RankView | None:
        if not self.row_count:
            return None
        key = self.coordinate_to_cell_key(Coordinate(self.cursor_row, 0)).row_key.value
        return self._ranks.get(key) if key is not None else None

    def point_at(self, rank: Who) -> None:
        """Put the cursor on a rank (the guilty one, when a diagnosis appears)."""
        for index, key in enumerate(self._cells):
            if self._ranks[key].key == rank:
                self.move_cursor(row=index)
                return


def row_key(rank: RankView) -> str:
    return f"{rank.node}/{rank.pid}"


def cells(rank: RankView, guilty: bool, threshold: float | None = None) -> list[Cell]:  # threshold in seconds
    # "!" marks the guilty rank where colour does not show (NO_COLOR, a monochrome terminal).
    label = ("!" if guilty else " ") + (str(rank.rank) if rank.rank is not None else "?")
    # The rank's own text: its escape sequences are shown, never sent to the terminal.
    row = [label, shown(rank.node), str(rank.pid), fmt.cpu_text(rank), shown(fmt.state_label(rank)),
           shown(rank.frame or fmt.NA), fmt.step_text(rank, threshold), visible(rank.last_line or "")]
    if guilty:
        return [(text, GUILTY_STYLE) for text in row]
    styles = [""] * len(row)
    styles[4] = STATE_STYLE.get(rank.state, "")
    return list(zip(row, styles, strict=True))
